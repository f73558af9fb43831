#pragma once
#include <nlohmann/json.hpp>
#include <string>
namespace opfuse::report {
// A self-contained page (no network: inline CSS, inline JS, inline SVG) showing an analysis.
std::string analysis_html(const nlohmann::json& analysis);
}
