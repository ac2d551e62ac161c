// The backend conformance suite's fixture, shared by its test files (backend_conformance_test.cpp,
// backend_attention_conformance_test.cpp): the backend under test, the ops it claims, outputs
// NaN-poisoned with a guard after them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/error.h"

namespace tessera::conformance {

inline constexpr size_t kGuard = 16;  // poisoned floats after every output

class BackendConformance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      backend_ = create_default<Backend>(GetParam());
    } catch (const Error& e) {
      if (GetParam() == "cpu") FAIL() << "the cpu backend must always be creatable: " << e.what();
      GTEST_SKIP() << "backend '" << GetParam() << "' cannot be created here: " << e.what();
    }
  }

  Backend& b() { return *backend_; }
  bool is_cpu() const { return GetParam() == "cpu"; }

  // Whether to run (op, dtype). The cpu backend is the reference and must implement every op the
  // design lists, so there a missing claim is a failure rather than a skip.
  bool claims(Op op, DType t) {
    const bool s = backend_->supports(op, t);
    if (!s && is_cpu()) ADD_FAILURE() << "cpu backend must support " << op_name(op) << " on " << dtype_name(t);
    return s;
  }

  // A poisoned output of n floats plus a poisoned guard after it.
  DeviceBuffer output(size_t n) { return poisoned_floats(b(), n + kGuard); }
  // Reads n floats and checks that the guard after them is untouched.
  std::vector<float> read_output(const DeviceBuffer& buf, size_t n) {
    std::vector<float> all = download<float>(b(), buf.get(), n + kGuard);
    EXPECT_TRUE(all_nan(std::span<const float>(all).subspan(n))) << "the kernel wrote past its output";
    all.resize(n);
    return all;
  }

  std::shared_ptr<Backend> backend_;
};

}  // namespace tessera::conformance
