// The check of an error test: the call throws hdk::Error and its message names what it must.
#pragma once

#include <functional>
#include <string>

namespace hdk {
namespace testing {

// Expects `call` to throw hdk::Error whose message contains `fragment` (a test failure otherwise).
void expect_error(const std::function<void()>& call, const std::string& fragment);

}  // namespace testing
}  // namespace hdk
