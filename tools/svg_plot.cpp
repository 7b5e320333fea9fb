#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace h2o_tools {

namespace {

constexpr double kWidth = 880, kHeight = 520;
constexpr double kLeft = 80, kRight = kWidth - 230, kTop = 50, kBottom = kHeight - 60;
// Enough for the evaluation's twelve policies without a repeat.
const char *const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                               "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"};
constexpr size_t kColorCount = sizeof(kColors) / sizeof(kColors[0]);

std::string xml_escape(const std::string &text) {
    std::string out;
    for (char c : text) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::string format(const char *fmt, double a, double b = 0, double c = 0, double d = 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), fmt, a, b, c, d);
    return buf;
}

std::string number_label(double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", std::fabs(v) < 1e-12 ? 0.0 : v);
    return buf;
}

// A round step (1, 2 or 5 times a power of ten) that cuts `range` into about five parts.
double nice_step(double range) {
    const double raw = range / 5;
    const double power = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0}) {
        if (m * power >= raw) return m * power;
    }
    return 10 * power;
}

// The axis range [lo, hi] widened to whole steps, and its ticks.
std::vector<double> nice_ticks(double *lo, double *hi) {
    if (*hi - *lo < 1e-12) {
        const double pad = std::max(std::fabs(*lo) * 0.05, 0.1);
        *lo -= pad;
        *hi += pad;
    }
    const double step = nice_step(*hi - *lo);
    *lo = std::floor(*lo / step + 1e-9) * step;
    *hi = std::ceil(*hi / step - 1e-9) * step;
    std::vector<double> ticks;
    for (double t = *lo; t <= *hi + step * 1e-6; t += step) ticks.push_back(t);
    return ticks;
}

// For a log axis: [lo, hi] widened to the enclosing values 1, 2, 5 x 10^k, which are the ticks.
std::vector<double> log_ticks(double *lo, double *hi) {
    std::vector<double> candidates;
    for (double p = std::floor(std::log10(*lo)) - 1; p <= std::ceil(std::log10(*hi)); ++p) {
        for (double m : {1.0, 2.0, 5.0}) candidates.push_back(m * std::pow(10.0, p));
    }
    double new_lo = candidates.front(), new_hi = candidates.back();
    for (double c : candidates) {
        if (c <= *lo * (1 + 1e-9)) new_lo = c;
    }
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
        if (*it >= *hi * (1 - 1e-9)) new_hi = *it;
    }
    std::vector<double> ticks;
    for (double c : candidates) {
        if (c >= new_lo && c <= new_hi) ticks.push_back(c);
    }
    *lo = new_lo;
    *hi = new_hi;
    return ticks;
}

}  // namespace

std::string render_svg(const Plot &plot) {
    auto fx = [&](double v) { return plot.log_x ? std::log2(v) : v; };
    auto usable = [&](double x, double y) { return std::isfinite(y) && std::isfinite(fx(x)) && (!plot.log_y || y > 0); };

    // Data ranges.
    double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
    for (const PlotSeries &s : plot.series) {
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
            if (!usable(s.x[i], s.y[i])) continue;
            x_lo = std::min(x_lo, fx(s.x[i]));
            x_hi = std::max(x_hi, fx(s.x[i]));
            y_lo = std::min(y_lo, s.y[i]);
            y_hi = std::max(y_hi, s.y[i]);
        }
    }
    for (const PlotLine &l : plot.lines) {
        if (!usable(x_lo, l.y)) continue;
        y_lo = std::min(y_lo, l.y);
        y_hi = std::max(y_hi, l.y);
    }
    for (double t : plot.x_ticks) {
        if (!std::isfinite(fx(t))) continue;
        x_lo = std::min(x_lo, fx(t));
        x_hi = std::max(x_hi, fx(t));
    }
    if (x_lo > x_hi) x_lo = 0, x_hi = 1;
    if (y_lo > y_hi) y_lo = 1, y_hi = 2;
    if (plot.x_from_zero && !plot.log_x) x_lo = std::min(x_lo, 0.0);

    // y_lo and y_hi end up in axis units (log10 of the data on a log axis), the ticks in data units.
    const std::vector<double> y_ticks = plot.log_y ? log_ticks(&y_lo, &y_hi) : nice_ticks(&y_lo, &y_hi);
    if (plot.log_y) y_lo = std::log10(y_lo), y_hi = std::log10(y_hi);
    std::vector<double> x_ticks;  // in data units
    if (plot.x_ticks.empty() && !plot.log_x) {
        x_ticks = nice_ticks(&x_lo, &x_hi);
    } else {
        for (double t : plot.x_ticks) {
            if (std::isfinite(fx(t))) x_ticks.push_back(t);
        }
        if (plot.log_x && x_ticks.empty()) {
            for (double p = std::floor(x_lo); p <= x_hi; ++p) x_ticks.push_back(std::exp2(p));
        }
        const double pad = std::max((x_hi - x_lo) * 0.08, 0.5);  // markers do not sit on the axes
        x_lo -= pad;
        x_hi += pad;
    }

    auto px = [&](double x) { return kLeft + (fx(x) - x_lo) / (x_hi - x_lo) * (kRight - kLeft); };
    auto py = [&](double y) {
        const double v = plot.log_y ? std::log10(y) : y;
        return kBottom - (v - y_lo) / (y_hi - y_lo) * (kBottom - kTop);
    };

    std::string svg;
    svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    svg += format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n",
        kWidth, kHeight, kWidth, kHeight);
    svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    svg += format("<text x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">", kWidth / 2) +
           xml_escape(plot.title) + "</text>\n";

    // Grid, ticks and tick labels.
    for (double t : y_ticks) {
        const double y = py(t);
        svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", kLeft, y, kRight, y);
        svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", kLeft - 5, y, kLeft, y);
        svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", kLeft - 8, y + 4) + number_label(t) + "</text>\n";
    }
    for (double t : x_ticks) {
        const double x = px(t);
        svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", x, kTop, x, kBottom);
        svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x, kBottom, x, kBottom + 5);
        svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x, kBottom + 19) + number_label(t) + "</text>\n";
    }
    // Axes and their labels.
    svg += format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", kLeft, kTop,
                  kRight - kLeft, kBottom - kTop);
    svg += format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (kLeft + kRight) / 2, kHeight - 18) + xml_escape(plot.x_label) +
           "</text>\n";
    svg += format("<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">", (kTop + kBottom) / 2,
                  (kTop + kBottom) / 2) +
           xml_escape(plot.y_label) + "</text>\n";

    // Data, then the legend (one entry per series and per reference line).
    double legend_y = kTop + 8;
    auto legend_entry = [&](const std::string &label, const char *color, bool dashed, bool marker) {
        svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke-width=\"2\" ", kRight + 15, legend_y, kRight + 45,
                      legend_y) +
               "stroke=\"" + color + "\"" + (dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
        if (marker) {
            svg += format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" ", kRight + 30, legend_y) + "fill=\"" + color + "\"/>\n";
        }
        svg += format("<text x=\"%.1f\" y=\"%.1f\">", kRight + 52, legend_y + 4) + xml_escape(label) + "</text>\n";
        legend_y += 20;
    };
    for (size_t i = 0; i < plot.lines.size(); ++i) {
        const PlotLine &l = plot.lines[i];
        const char *color = i == 0 ? "black" : kColors[(plot.series.size() + i) % kColorCount];
        if (std::isfinite(l.y) && (!plot.log_y || l.y > 0)) {
            svg += format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\" ", kLeft,
                          py(l.y), kRight, py(l.y)) +
                   "stroke=\"" + color + "\"/>\n";
        }
        legend_entry(l.label, color, true, false);
    }
    for (size_t i = 0; i < plot.series.size(); ++i) {
        const PlotSeries &s = plot.series[i];
        const char *color = kColors[i % kColorCount];
        std::string points, markers;
        for (size_t j = 0; j < s.x.size() && j < s.y.size(); ++j) {
            if (!usable(s.x[j], s.y[j])) continue;
            points += format("%.1f,%.1f ", px(s.x[j]), py(s.y[j]));
            markers += format("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" ", px(s.x[j]), py(s.y[j])) + "fill=\"" + color + "\"/>\n";
        }
        if (!points.empty()) points.pop_back();
        svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(color) + "\" points=\"" + points + "\"/>\n";
        svg += markers;
        legend_entry(s.label, color, false, true);
    }
    svg += "</svg>\n";
    return svg;
}

}  // namespace h2o_tools
