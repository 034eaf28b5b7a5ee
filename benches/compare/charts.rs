//! SVG charts of `benches/compare.rs` (plotters, SVG backend only): every chart is log–log,
//! one line per series through the medians, with a min–max error bar at each point. A series
//! with nothing to draw is left out (not in the legend either), and callers leave out panels
//! with no series to draw ([`Panel::has_data`]), so a chart shows only what a run measured.

use std::path::Path;

use plotters::prelude::*;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One point: x, and the median, minimum and maximum of y over the repetitions.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    /// x.
    pub x: f64,
    /// Median of y.
    pub med: f64,
    /// Minimum of y.
    pub min: f64,
    /// Maximum of y.
    pub max: f64,
}

/// A named line.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Points (non-positive or NaN values are left out: the axes are logarithmic).
    pub points: Vec<Point>,
    /// Palette index (0 = ours, then one per peer).
    pub color: usize,
    /// Drawn with triangles and a thinner line (e.g. p99 next to p50).
    pub secondary: bool,
}

/// One panel of a chart.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Caption.
    pub title: String,
    /// x axis description.
    pub x_desc: String,
    /// y axis description.
    pub y_desc: String,
    /// Lines.
    pub series: Vec<Series>,
}

impl Panel {
    /// Whether any series has a point that can be drawn.
    pub fn has_data(&self) -> bool {
        self.series.iter().any(|s| s.points.iter().any(usable))
    }
}

fn color(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
    ];
    PALETTE[i % PALETTE.len()]
}

fn usable(p: &Point) -> bool {
    p.x > 0.0 && p.med > 0.0 && p.med.is_finite() && p.min.is_finite() && p.max.is_finite()
}

/// A log range around `values`, padded so a single value still gets an axis.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return 0.1..10.0;
    }
    // headroom above for the legend
    lo / 2.0..hi * 6.0
}

fn draw_panel<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, panel: &Panel) -> Res<()>
where
    DB::ErrorType: 'static,
{
    let pts = || panel.series.iter().flat_map(|s| s.points.iter().filter(|p| usable(p)));
    let xr = log_range(pts().map(|p| p.x));
    let yr = log_range(pts().flat_map(|p| [p.min.max(p.med * 1e-3), p.max]));
    // x ticks at the measured x values (N, or rates), y ticks at 1-2-5 steps
    let mut xs: Vec<f64> = pts().map(|p| p.x).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let ys = ticks_125(&yr);
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xr.log_scale().with_key_points(xs), yr.log_scale().with_key_points(ys))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(panel.x_desc.as_str())
        .y_desc(panel.y_desc.as_str())
        .x_label_formatter(&|x| format_num(*x))
        .y_label_formatter(&|y| format_num(*y))
        .draw()
        .map_err(|e| e.to_string())?;
    for s in &panel.series {
        let c = color(s.color);
        let mut points: Vec<Point> = s.points.iter().copied().filter(usable).collect();
        if points.is_empty() {
            continue;
        }
        points.sort_by(|a, b| a.x.total_cmp(&b.x));
        let width = if s.secondary { 1 } else { 2 };
        let line = points.iter().map(|p| (p.x, p.med));
        let secondary = s.secondary;
        chart
            .draw_series(LineSeries::new(line, c.stroke_width(width)))
            .map_err(|e| e.to_string())?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width)));
        if secondary {
            chart
                .draw_series(points.iter().map(|p| TriangleMarker::new((p.x, p.med), 5, c.filled())))
                .map_err(|e| e.to_string())?;
        } else {
            chart
                .draw_series(points.iter().map(|p| Circle::new((p.x, p.med), 4, c.filled())))
                .map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|p| p.max > p.min)
                    .map(|p| ErrorBar::new_vertical(p.x, p.min.max(p.med * 1e-3), p.med, p.max, c.stroke_width(1), 8)),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// 1, 2, 5 × powers of ten inside `r`.
fn ticks_125(r: &std::ops::Range<f64>) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powf(r.start.log10().floor());
    while decade <= r.end {
        for m in [1.0, 2.0, 5.0] {
            let v = decade * m;
            if v >= r.start && v <= r.end {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

/// 1234 → "1234", 12345 → "12k", 0.25 → "0.25".
pub fn format_num(x: f64) -> String {
    let a = x.abs();
    if a >= 1e6 {
        format!("{}M", trim(x / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(x / 1e3))
    } else if a >= 1.0 {
        format!("{x:.0}")
    } else {
        trim(x)
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Writes `panels` into one SVG at `path`: side by side, two to a row from four panels on.
pub fn write(path: &Path, panels: &[Panel]) -> Res<()> {
    let cols = match panels.len() {
        0 => 1,
        k @ 1..=3 => k,
        _ => 2,
    };
    let rows = panels.len().max(1).div_ceil(cols);
    let width = 560 * u32::try_from(cols).unwrap_or(1);
    let height = 460 * u32::try_from(rows).unwrap_or(1);
    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((rows, cols));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}
