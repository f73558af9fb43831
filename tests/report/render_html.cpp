// opfuse_render_html IN.json OUT.html: the analysis page for a hand-written analysis, so the
// page can be checked in a browser without profiling anything.
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "opfuse/report_html.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " IN.json OUT.html\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << argv[1] << ": cannot read\n";
    return 1;
  }
  const nlohmann::json analysis = nlohmann::json::parse(in, nullptr, false);
  if (analysis.is_discarded()) {
    std::cerr << argv[1] << ": not JSON\n";
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary);
  out << opfuse::report::analysis_html(analysis);
  if (!out.flush()) {
    std::cerr << argv[2] << ": cannot write\n";
    return 1;
  }
  return 0;
}
