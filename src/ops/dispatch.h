// Typed handles to the opfuse operators, looked up once in the dispatcher by name.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace opfuse {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

}  // namespace opfuse
