//! Grouped bar charts as SVG (plotters), shared by every `reproduce` target: one call
//! per figure, the same layout everywhere (groups on x, one coloured bar per series,
//! a legend, an optional reference line such as "1.0x").

use plotters::coord::Shift;
use plotters::prelude::*;
use std::error::Error;
use std::path::Path;

/// One series of bars: a name for the legend, a colour, one value per group (`NaN`
/// draws no bar for that group).
pub struct BarSeries {
    /// Legend text.
    pub name: String,
    /// Bar colour.
    pub color: RGBColor,
    /// One value per group.
    pub values: Vec<f64>,
}

/// A grouped bar chart.
pub struct BarChart {
    /// Title above the chart.
    pub caption: String,
    /// The x categories.
    pub groups: Vec<String>,
    /// The bars of each group, in this order.
    pub series: Vec<BarSeries>,
    /// Y axis label.
    pub y_desc: String,
    /// A horizontal reference line (e.g. 1.0 for speedups).
    pub reference: Option<f64>,
}

/// The palette the reproduce targets share.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(90, 140, 200),
    RGBColor(230, 150, 60),
    RGBColor(110, 170, 90),
    RGBColor(170, 170, 170),
    RGBColor(190, 90, 120),
    RGBColor(120, 90, 170),
];

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    c: &BarChart,
) -> Result<(), Box<dyn Error>>
where
    DB::ErrorType: 'static,
{
    let n = c.groups.len().max(1);
    let max = c
        .series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .chain(c.reference)
        .fold(1e-9, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(&c.caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, 0.0..max * 1.15)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 1e-6 {
                c.groups.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 10))
        .y_desc(c.y_desc.as_str())
        .draw()?;
    let k_count = c.series.len().max(1) as f64;
    let width = 0.8 / k_count;
    for (k, s) in c.series.iter().enumerate() {
        let color = s.color;
        let bars = s
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, v)| {
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, *v)], color.filled())
            });
        chart
            .draw_series(bars)?
            .label(s.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    if let Some(r) = c.reference {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, r), (n as f64, r)],
            BLACK.stroke_width(1),
        )))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

/// Write `charts` side by side into one SVG of `size` pixels.
///
/// # Errors
/// The plotting backend's error (an unwritable path, a drawing failure).
pub fn write_svg(path: &Path, size: (u32, u32), charts: &[BarChart]) -> Result<(), Box<dyn Error>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, charts.len().max(1)));
    for (area, chart) in areas.iter().zip(charts) {
        draw(area, chart)?;
    }
    root.present()?;
    Ok(())
}
