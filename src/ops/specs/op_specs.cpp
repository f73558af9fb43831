// The table of op specs: every spec that registered itself (src/ops/<op>/<op>_spec.cpp), by name.
#include <algorithm>

#include "opfuse/op_spec.h"

namespace opfuse {
namespace {

std::vector<OpSpec (*)()>& registered() {
  static std::vector<OpSpec (*)()> makers;
  return makers;
}

}  // namespace

OpSpecRegistration::OpSpecRegistration(OpSpec (*make)()) { registered().push_back(make); }

const std::vector<OpSpec>& op_specs() {
  // Made on first use, not as the specs register: making one may need the operators registered.
  static const std::vector<OpSpec> table = [] {
    std::vector<OpSpec> specs;
    for (OpSpec (*make)() : registered()) specs.push_back(make());
    std::sort(specs.begin(), specs.end(), [](const OpSpec& a, const OpSpec& b) { return a.name < b.name; });
    return specs;
  }();
  return table;
}

const OpSpec* find_op_spec(const std::string& name) {
  for (const OpSpec& spec : op_specs())
    if (spec.name == name) return &spec;
  return nullptr;
}

}  // namespace opfuse
