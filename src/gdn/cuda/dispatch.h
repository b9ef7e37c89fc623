// Compile-time dispatch over the head sizes the CUDA kernels are built for, kept in one place.
#pragma once

#include <string>

#include "hdk/error.h"

// Runs the body with `constexpr int kHeadK` bound to 64, 128 or 256.
#define HDK_DISPATCH_HEAD_K(head_k, ...)                                                       \
  [&] {                                                                                        \
    switch (head_k) {                                                                          \
      case 64: {                                                                               \
        constexpr int kHeadK = 64;                                                             \
        return __VA_ARGS__();                                                                  \
      }                                                                                        \
      case 128: {                                                                              \
        constexpr int kHeadK = 128;                                                            \
        return __VA_ARGS__();                                                                  \
      }                                                                                        \
      case 256: {                                                                              \
        constexpr int kHeadK = 256;                                                            \
        return __VA_ARGS__();                                                                  \
      }                                                                                        \
      default:                                                                                 \
        throw ::hdk::Error("hdk::gdn::decode: CUDA kernels exist for K = 64, 128, 256; got " + \
                           std::to_string(head_k));                                            \
    }                                                                                          \
  }()
