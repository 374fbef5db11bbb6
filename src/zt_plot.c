/* zt_plot.c — SVG line plots (see zt_plot.h). */
#include "zt_plot.h"

#include <math.h>
#include <stdio.h>

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"};

int zt_plot_svg(const char *path, const char *title, const zt_plot_series_t *series, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    double xmax = 1, ymin = INFINITY, ymax = -INFINITY;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < series[k].n; i++) {
            if (!isfinite(series[k].value[i])) continue;
            xmax = fmax(xmax, (double)series[k].step[i]);
            ymin = fmin(ymin, series[k].value[i]);
            ymax = fmax(ymax, series[k].value[i]);
        }
    if (!isfinite(ymin)) ymin = 0, ymax = 1;
    if (ymax - ymin < 1e-6) ymax = ymin + 1;
    const double W = 800, H = 480, x0 = 70, y0 = 30, pw = W - 100, ph = H - 90;
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' font-family='sans-serif' font-size='13'>\n", W, H);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='%.0f' y='20'>%s</text>\n", x0, title);
    fprintf(f, "<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' fill='none' stroke='black'/>\n", x0, y0, pw, ph);
    for (int i = 0; i <= 4; i++) {
        double v = ymin + (ymax - ymin) * i / 4.0, y = y0 + ph - ph * i / 4.0;
        fprintf(f, "<text x='5' y='%.1f'>%.3f</text><line x1='%.0f' x2='%.0f' y1='%.1f' y2='%.1f' stroke='#ddd'/>\n",
                y + 4, v, x0, x0 + pw, y, y);
        fprintf(f, "<text x='%.1f' y='%.0f'>%.0f</text>\n", x0 + pw * i / 4.0 - 10, y0 + ph + 18, xmax * i / 4.0);
    }
    fprintf(f, "<text x='%.0f' y='%.0f'>step</text>\n", x0 + pw / 2, H - 20);
    for (int k = 0; k < n; k++) {
        const zt_plot_series_t *s = &series[k];
        const char *color = palette[k % (int)(sizeof palette / sizeof *palette)];
        if (!s->n) continue;
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", color);
        for (int i = 0; i < s->n; i++)
            if (isfinite(s->value[i]))
                fprintf(f, "%.1f,%.1f ", x0 + pw * s->step[i] / xmax, y0 + ph - ph * (s->value[i] - ymin) / (ymax - ymin));
        fprintf(f, "'/>\n<text x='%.0f' y='%.0f' fill='%s'>%s</text>\n", x0 + pw - 130, y0 + 20 + 18 * k, color,
                s->label);
    }
    fprintf(f, "</svg>\n");
    return fclose(f) == 0 ? 0 : -1;
}
