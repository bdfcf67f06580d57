//! The sweep plot: average JCT against arrival rate on a log scale, every seed shown, and a
//! ratio panel (kudos / kube-default, kudos / greedy oracle) so the headline can be read off
//! the whole curve rather than one point.

use crate::output::Cell;
use plotters::prelude::*;
use std::path::Path;

/// Per rate: the mean over seeds and the per-seed values.
type Series = Vec<(f64, f64, Vec<f64>)>;

/// Policy names in first-seen order.
fn policies(cells: &[Cell]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for c in cells {
        if !out.contains(&c.policy.as_str()) {
            out.push(&c.policy);
        }
    }
    out
}

/// Average JCT of one policy, by rate.
fn series(cells: &[Cell], policy: &str) -> Series {
    let mut v: Series = cells
        .iter()
        .filter(|c| c.policy == policy)
        .filter_map(|c| {
            let seeds = c.per_seed.iter().map(|m| m.avg_jct_h).collect();
            c.rate_per_hour.map(|r| (r, c.mean.avg_jct_h, seeds))
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// Per rate: the ratio of the means, and the per-seed ratios (same seed, same jobs).
fn ratios(cells: &[Cell], num: &str, den: &str) -> Series {
    let (a, b) = (series(cells, num), series(cells, den));
    a.iter()
        .filter_map(|(r, m, s)| {
            let (_, dm, ds) = b.iter().find(|x| x.0 == *r)?;
            let per_seed = s.iter().zip(ds).map(|(x, y)| x / y.max(1e-9)).collect();
            Some((*r, m / dm.max(1e-9), per_seed))
        })
        .collect()
}

/// Writes the SVG: `title` should name the throughput table, the cluster and the seeds.
pub fn plot(cells: &[Cell], path: &Path, title: &str) -> anyhow::Result<()> {
    let names = policies(cells);
    let xs: Vec<f64> = cells.iter().filter_map(|c| c.rate_per_hour).collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::INFINITY, f64::min),
        xs.iter().copied().fold(0.0, f64::max),
    );
    let all = cells
        .iter()
        .flat_map(|c| c.per_seed.iter().map(|m| m.avg_jct_h))
        .filter(|v| *v > 0.0);
    let (y0, y1) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    anyhow::ensure!(
        x0.is_finite() && y0.is_finite() && y1 > 0.0,
        "nothing to plot"
    );
    let pad = ((x1 - x0) * 0.03).max(1e-3);
    let root = SVGBackend::new(path, (960, 860)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 18))?;
    let (upper, lower) = root.split_vertically(520);

    let mut chart = ChartBuilder::on(&upper)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), (y0 * 0.8..y1 * 1.25).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("arrival rate (jobs/hour)")
        .y_labels(12)
        .y_desc("average JCT (hours, log scale)")
        .draw()?;
    for (k, p) in names.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let s = series(cells, p);
        let mean: Vec<(f64, f64)> = s.iter().map(|(r, m, _)| (*r, *m)).collect();
        chart
            .draw_series(LineSeries::new(mean, color.stroke_width(2)))?
            .label(format!("{p} (mean; dots: seeds)"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(s.iter().flat_map(|(r, _, seeds)| {
            seeds
                .iter()
                .filter(|v| **v > 0.0)
                .map(move |v| Circle::new((*r, *v), 2, color.mix(0.45).filled()))
        }))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let pairs = [
        ("kudos", "kube-default"),
        ("kudos", "greedy-oracle"),
        ("kudos", "fastest-type"),
    ];
    let panels: Vec<(String, Series)> = pairs
        .iter()
        .map(|(a, b)| (format!("{a} / {b}"), ratios(cells, a, b)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    let r1 = panels
        .iter()
        .flat_map(|(_, v)| v.iter().flat_map(|(_, m, s)| s.iter().copied().chain([*m])))
        .fold(1.2f64, f64::max)
        .min(4.0);
    let mut ratio = ChartBuilder::on(&lower)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(65)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..r1 * 1.05)?;
    ratio
        .configure_mesh()
        .x_desc("arrival rate (jobs/hour)")
        .y_desc("JCT ratio (dots: seeds, clipped at 4)")
        .draw()?;
    ratio.draw_series(LineSeries::new(
        vec![(x0 - pad, 1.0), (x1 + pad, 1.0)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    for (k, (label, v)) in panels.iter().enumerate() {
        let color = Palette99::pick(k + 10).to_rgba();
        let mean: Vec<(f64, f64)> = v.iter().map(|(r, m, _)| (*r, *m)).collect();
        ratio
            .draw_series(LineSeries::new(mean, color.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        ratio.draw_series(v.iter().flat_map(|(r, _, seeds)| {
            seeds
                .iter()
                .map(move |s| Circle::new((*r, s.min(r1)), 2, color.mix(0.45).filled()))
        }))?;
    }
    ratio
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
