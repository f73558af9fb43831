// The table of op specs, in the order bench-op lists them. Each spec is made by its op's
// <op>_spec.cpp (geglu's beside swiglu's, in swiglu_spec.cpp).
#include "opfuse/op_spec.h"

namespace opfuse {
namespace specs {
OpSpec silu_spec();
OpSpec swish_spec();
OpSpec se_gate_spec();
OpSpec batch_norm_silu_spec();
OpSpec drop_connect_add_spec();
OpSpec rms_norm_spec();
OpSpec swiglu_spec();
OpSpec geglu_spec();
OpSpec attention_spec();
OpSpec rotary_embedding_spec();
OpSpec adamw_spec();
OpSpec sgd_spec();
OpSpec cross_entropy_spec();
OpSpec linear_cross_entropy_spec();
OpSpec add_rms_norm_spec();
}  // namespace specs

const std::vector<OpSpec>& op_specs() {
  using namespace specs;
  static const std::vector<OpSpec> table{
      silu_spec(),     swish_spec(),        se_gate_spec(),       batch_norm_silu_spec(), drop_connect_add_spec(),
      rms_norm_spec(), swiglu_spec(),       geglu_spec(),         attention_spec(),     rotary_embedding_spec(), adamw_spec(),
      cross_entropy_spec(), linear_cross_entropy_spec(), add_rms_norm_spec(), sgd_spec()};
  return table;
}

const OpSpec* find_op_spec(const std::string& name) {
  for (const OpSpec& spec : op_specs())
    if (spec.name == name) return &spec;
  return nullptr;
}

}  // namespace opfuse
