// A minimal line chart written as SVG by hand: polylines with markers, dashed horizontal
// reference lines, axes with ticks and labels, a legend and a title. No dependencies.
#pragma once

#include <string>
#include <vector>

namespace h2o_tools {

struct PlotSeries {
    std::string label;
    std::vector<double> x, y;  // same length; non-finite points are skipped
};

// A horizontal dashed line across the whole plot (e.g. a baseline).
struct PlotLine {
    std::string label;
    double y = 0;
};

struct Plot {
    std::string title, x_label, y_label;
    bool log_x = false;           // x on a log2 scale (e.g. cache budgets)
    bool log_y = false;           // y on a log10 scale, ticks at 1, 2, 5 x 10^k
    bool x_from_zero = false;     // a linear x axis starts at 0
    std::vector<double> x_ticks;  // empty: evenly spaced round numbers
    std::vector<PlotSeries> series;
    std::vector<PlotLine> lines;
};

// The whole SVG document.
std::string render_svg(const Plot &plot);

}  // namespace h2o_tools
