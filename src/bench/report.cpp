// SVG drawn by hand: a report with two histograms, a timeline and a line chart does not justify
// a plotting library, and inline SVG keeps the file self-contained.
#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace bench {
namespace {

constexpr int kWidth = 640, kHeight = 260, kLeft = 56, kBottom = 36, kTop = 28, kRight = 16;

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

struct Frame {
  std::ostringstream svg;
  double x0, x1, y0, y1;
  Frame(const std::string& title, const std::string& xlabel, const std::string& ylabel, double xa,
        double xb, double ya, double yb)
      : x0(xa), x1(xb > xa ? xb : xa + 1), y0(ya), y1(yb > ya ? yb : ya + 1) {
    svg << "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth
        << "\" height=\"" << kHeight << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\">\n"
        << "<text x=\"" << kWidth / 2 << "\" y=\"18\" text-anchor=\"middle\" class=\"title\">"
        << escape(title) << "</text>\n"
        << "<line x1=\"" << kLeft << "\" y1=\"" << kHeight - kBottom << "\" x2=\""
        << kWidth - kRight << "\" y2=\"" << kHeight - kBottom << "\" class=\"axis\"/>\n"
        << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\""
        << kHeight - kBottom << "\" class=\"axis\"/>\n"
        << "<text x=\"" << kWidth / 2 << "\" y=\"" << kHeight - 6 << "\" text-anchor=\"middle\">"
        << escape(xlabel) << "</text>\n"
        << "<text x=\"14\" y=\"" << kHeight / 2 << "\" transform=\"rotate(-90 14 " << kHeight / 2
        << ")\" text-anchor=\"middle\">" << escape(ylabel) << "</text>\n";
    for (int i = 0; i <= 4; ++i) {
      const double xv = x0 + (x1 - x0) * i / 4, yv = y0 + (y1 - y0) * i / 4;
      svg << "<text x=\"" << X(xv) << "\" y=\"" << kHeight - kBottom + 14
          << "\" text-anchor=\"middle\" class=\"tick\">" << fmt(xv) << "</text>\n"
          << "<text x=\"" << kLeft - 4 << "\" y=\"" << Y(yv) + 4
          << "\" text-anchor=\"end\" class=\"tick\">" << fmt(yv) << "</text>\n";
    }
  }
  double X(double v) const { return kLeft + (v - x0) / (x1 - x0) * (kWidth - kLeft - kRight); }
  double Y(double v) const {
    return kHeight - kBottom - (v - y0) / (y1 - y0) * (kHeight - kBottom - kTop);
  }
  std::string done() {
    svg << "</svg>\n";
    return svg.str();
  }
};

std::string histogram(const std::string& title, const std::string& xlabel,
                      const std::vector<double>& values) {
  if (values.empty()) return "<p>No " + escape(title) + " data.</p>\n";
  const double lo = *std::min_element(values.begin(), values.end());
  const double hi = *std::max_element(values.begin(), values.end());
  const int bins = 30;
  const double width = (hi - lo) / bins > 0 ? (hi - lo) / bins : 1;
  std::vector<int> counts(bins, 0);
  for (double v : values) counts[std::min(bins - 1, static_cast<int>((v - lo) / width))]++;
  Frame f(title, xlabel, "requests / intervals", lo, lo + width * bins, 0,
          *std::max_element(counts.begin(), counts.end()));
  for (int b = 0; b < bins; ++b) {
    const double x = f.X(lo + b * width), w = f.X(lo + (b + 1) * width) - x;
    f.svg << "<rect class=\"bar\" x=\"" << x << "\" y=\"" << f.Y(counts[b]) << "\" width=\""
          << std::max(w - 1, 1.0) << "\" height=\"" << f.Y(0) - f.Y(counts[b]) << "\"/>\n";
  }
  return f.done();
}

}  // namespace

std::string render_html_report(const std::vector<RequestResult>& results, const Summary& summary,
                               const std::string& title) {
  std::vector<double> ttfts, itls;
  double end = 0;
  std::map<int64_t, double> per_second;
  for (const RequestResult& r : results) {
    end = std::max(end, r.start_time + r.latency);
    if (!r.success) continue;
    ttfts.push_back(r.ttft * 1000);
    for (double g : r.itl) itls.push_back(g * 1000);
    const double per_chunk =
        r.chunk_times.empty() ? 0 : double(r.output_tokens) / double(r.chunk_times.size());
    for (double t : r.chunk_times)
      per_second[static_cast<int64_t>(std::floor(r.start_time + t))] += per_chunk;
  }
  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << escape(title)
       << "</title>\n<style>\n"
       << "body{font-family:sans-serif;margin:24px;color:#222} table{border-collapse:collapse} "
          "td{padding:2px 12px;border-bottom:1px solid #ddd} .plot{margin:12px 0;border:1px solid "
          "#ccc;background:#fff} "
          ".axis{stroke:#333} .bar{fill:#4477aa} .wait{stroke:#ccbb44;stroke-width:3} "
          ".decode{stroke:#228833;stroke-width:3} "
          ".fail{stroke:#cc3311;stroke-width:3} .line{fill:none;stroke:#aa3377;stroke-width:2} "
          ".tick{font-size:10px} "
          ".title{font-weight:bold} text{font-size:12px}\n</style></head><body>\n"
       << "<h1>" << escape(title) << "</h1>\n<table>\n";
  for (const char* key :
       {"completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
        "request_throughput", "output_throughput", "total_token_throughput",
        "max_output_tokens_per_s", "max_concurrent_requests", "mean_ttft_ms", "median_ttft_ms",
        "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms"}) {
    if (summary.result.contains(key))
      html << "<tr><td>" << key << "</td><td>" << summary.result[key].dump() << "</td></tr>\n";
  }
  html << "</table>\n";
  html << histogram("Time to first token", "TTFT (ms)", ttfts);
  html << histogram("Inter-token latency", "ITL (ms)", itls);
  {
    Frame f(
        "Per-request timeline (yellow: waiting for the first token, green: decoding, red: failed)",
        "seconds since start", "request", 0, end, 0, static_cast<double>(results.size()));
    for (size_t i = 0; i < results.size(); ++i) {
      const RequestResult& r = results[i];
      const double y = f.Y(static_cast<double>(i) + 0.5);
      if (!r.success) {
        f.svg << "<line class=\"fail\" x1=\"" << f.X(r.start_time) << "\" y1=\"" << y << "\" x2=\""
              << f.X(r.start_time) + 3 << "\" y2=\"" << y << "\"/>\n";
        continue;
      }
      f.svg << "<line class=\"wait\" x1=\"" << f.X(r.start_time) << "\" y1=\"" << y << "\" x2=\""
            << f.X(r.start_time + r.ttft) << "\" y2=\"" << y << "\"/>\n"
            << "<line class=\"decode\" x1=\"" << f.X(r.start_time + r.ttft) << "\" y1=\"" << y
            << "\" x2=\"" << f.X(r.start_time + r.latency) << "\" y2=\"" << y << "\"/>\n";
    }
    html << f.done();
  }
  {
    double peak = 0;
    for (const auto& [s, n] : per_second) peak = std::max(peak, n);
    Frame f("Output throughput over time", "seconds since start", "tokens/s", 0, std::ceil(end), 0,
            peak);
    std::string points;
    for (const auto& [s, n] : per_second) points += fmt(f.X(s + 0.5)) + "," + fmt(f.Y(n)) + " ";
    f.svg << "<polyline class=\"line\" points=\"" << points << "\"/>\n";
    html << f.done();
  }
  html << "</body></html>\n";
  return html.str();
}

}  // namespace bench
