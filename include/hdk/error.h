// The one exception type hdk throws for invalid calls and backend failures.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace hdk {

class Error : public std::exception {
 public:
  explicit Error(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace hdk
