#include "support/expect_error.h"

#include <gtest/gtest.h>

#include "hdk/error.h"

namespace hdk {
namespace testing {

void expect_error(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no hdk::Error; expected one containing '" << fragment << "'";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
        << "message: " << error.what() << "\nexpected to contain: " << fragment;
  }
}

}  // namespace testing
}  // namespace hdk
