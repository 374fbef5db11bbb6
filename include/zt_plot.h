/* zt_plot.h — line plots as SVG with no dependencies (the run's loss.svg).
 *
 * Series are plain (step, value) arrays; non-finite values are left out. Both axes
 * are linear: x from 0 to the largest step (at least 1), y over the finite values. */
#ifndef ZT_PLOT_H
#define ZT_PLOT_H

typedef struct zt_plot_series {
    const char *label;   /* the legend's text */
    const long *step;
    const float *value;
    int n;               /* points; a series without any is not drawn */
} zt_plot_series_t;

/* Writes an 800x480 SVG of n series (colored in turn from a fixed palette) with a
 * title line to path. Returns 0, or -1 when path cannot be opened. */
int zt_plot_svg(const char *path, const char *title, const zt_plot_series_t *series, int n);

#endif
