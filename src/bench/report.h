// One self-contained HTML report of a benchmark run (no scripts, no network): the summary
// table and inline SVG plots of the TTFT and ITL distributions, a per-request timeline
// (waiting for the first token, then decoding) and output throughput over time. Pure function.
#pragma once

#include <string>
#include <vector>

#include "bench/request_result.h"
#include "bench/summary.h"

namespace bench {

std::string render_html_report(const std::vector<RequestResult>& results, const Summary& summary,
                               const std::string& title);

}  // namespace bench
