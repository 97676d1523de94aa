//! SVG charts (plotters' SVG backend writes `<text>` elements itself: no font files needed).

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::Record;
use crate::size::{format_bits, format_rate, format_size};

const SIZE: (u32, u32) = (1000, 650);

struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    /// The raw baseline (mode "raw") or iperf3 (mode "ideal"): drawn dashed, as a limit.
    ideal: bool,
    /// Mode "ideal" (iperf3): grey, and it is then *the* ideal line.
    iperf: bool,
}

/// Writes `<prefix>-msgs.svg` (msg/s against payload, log-log, one line per system),
/// `<prefix>-bits.svg` (bit/s against payload, the raw TCP baseline as the ideal line) when
/// throughput records exist, and `<prefix>-lat.svg` (p50/p99/p99.9 per system, log scale) when
/// latency records exist. Failed points are left out. Returns the files written.
pub fn write_charts(prefix: &Path, records: &[Record]) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(dir) = prefix.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let path = |suffix: &str| {
        let mut s = prefix.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    let mut written = Vec::new();
    let msgs = thr_series(records, |r| r.msgs_per_sec);
    if !msgs.is_empty() {
        let p = path("-msgs.svg");
        line_chart(
            &p,
            "Throughput (messages)",
            "msg/s",
            &msgs,
            format_rate,
            &PAYLOAD_AXIS,
        )?;
        written.push(p);
        let p = path("-bits.svg");
        let bits = thr_series(records, |r| r.bits_per_sec);
        line_chart(
            &p,
            "Throughput (payload bits)",
            "bit/s",
            &bits,
            format_bits,
            &PAYLOAD_AXIS,
        )?;
        written.push(p);
    }
    if records
        .iter()
        .any(|r| r.test == "lat" && r.p50_us.is_some())
    {
        let p = path("-lat.svg");
        lat_chart(&p, records)?;
        written.push(p);
    }
    let fan: Vec<&Record> = records
        .iter()
        .filter(|r| r.test == "fanout" && r.bits_per_sec.is_some())
        .collect();
    if !fan.is_empty() {
        let payloads: std::collections::BTreeSet<usize> =
            fan.iter().map(|r| r.payload_bytes).collect();
        let mut series: Vec<Series> = Vec::new();
        for r in &fan {
            let label = if payloads.len() > 1 {
                format!("{} {}", r.label(), format_size(r.payload_bytes))
            } else {
                r.label()
            };
            let i = match series.iter().position(|s| s.label == label) {
                Some(i) => i,
                None => {
                    series.push(Series {
                        label,
                        points: Vec::new(),
                        ideal: false,
                        iperf: false,
                    });
                    series.len() - 1
                }
            };
            series[i].points.push((
                r.concurrency.unwrap_or(1) as f64,
                r.bits_per_sec.unwrap_or(0.0),
            ));
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let p = path("-fanout.svg");
        line_chart(
            &p,
            "Fan-out: aggregate payload bits delivered to N local subscriber processes",
            "bit/s (sum over subscribers)",
            &series,
            format_bits,
            &XAxis {
                desc: "subscriber processes",
                fmt: |v| format!("{v:.0}"),
            },
        )?;
        written.push(p);
    }
    let rpc: Vec<&Record> = records
        .iter()
        .filter(|r| r.test == "rpc" && r.msgs_per_sec.is_some())
        .collect();
    if !rpc.is_empty() {
        let p = path("-rpc.svg");
        rpc_bars(&p, &rpc)?;
        written.push(p);
        let series = rpc_series(&rpc);
        if series.iter().any(|s| s.points.len() > 1) {
            let p = path("-rpc-concurrency.svg");
            line_chart(
                &p,
                "RPC calls per second against concurrency",
                "calls/s",
                &series,
                format_rate,
                &XAxis {
                    desc: "concurrency (callers, one call in flight each)",
                    fmt: |v| format!("{v:.0}"),
                },
            )?;
            written.push(p);
        }
    }
    Ok(written)
}

/// The concurrency-1 figure of each system (its point with the most calls), in first
/// appearance order.
fn rpc_sequential<'a>(rpc: &[&'a Record]) -> Vec<&'a Record> {
    let mut out: Vec<&Record> = Vec::new();
    for r in rpc.iter().filter(|r| r.concurrency.unwrap_or(1) == 1) {
        match out.iter().position(|o| o.label() == r.label()) {
            Some(i) if out[i].samples < r.samples => out[i] = r,
            Some(_) => {}
            None => out.push(r),
        }
    }
    out
}

/// One series per system: calls/s against concurrency (concurrency 1: the point with the most
/// calls).
fn rpc_series(rpc: &[&Record]) -> Vec<Series> {
    let seq = rpc_sequential(rpc);
    let mut out: Vec<Series> = Vec::new();
    for r in rpc
        .iter()
        .filter(|r| r.concurrency.unwrap_or(1) > 1)
        .copied()
        .chain(seq.iter().copied())
    {
        let Some(v) = r.msgs_per_sec else { continue };
        series_of(&mut out, r)
            .points
            .push((r.concurrency.unwrap_or(1) as f64, v));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Calls per second at concurrency 1, one bar per system (log scale: brokerless systems in
/// the same process are an order of magnitude apart from brokers).
fn rpc_bars(path: &Path, rpc: &[&Record]) -> anyhow::Result<()> {
    let seq = rpc_sequential(rpc);
    let n = seq.len().max(1) as u32;
    let (y0, y1) = log_bounds(seq.iter().filter_map(|r| r.msgs_per_sec));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "RPC at concurrency 1 (calls per second, higher is better)",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(90)
        .build_cartesian_2d((0u32..n).into_segmented(), (y0 / 2.0..y1 * 1.5).log_scale())?;
    let labels: Vec<String> = seq.iter().map(|r| r.label()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("system")
        .y_desc("calls/s")
        .x_labels(n as usize)
        .x_label_style(("sans-serif", 12))
        .x_label_formatter(&|v| {
            let i = match v {
                SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => *i,
                SegmentValue::Last => n,
            };
            labels.get(i as usize).cloned().unwrap_or_default()
        })
        .y_label_formatter(&|y| short(format_rate(*y)))
        .draw()?;
    for (i, r) in seq.iter().enumerate() {
        let Some(v) = r.msgs_per_sec else { continue };
        let style = color(i).filled();
        let i = i as u32;
        chart.draw_series(std::iter::once(Rectangle::new(
            [
                (SegmentValue::Exact(i), y0 / 2.0),
                (SegmentValue::Exact(i + 1), v),
            ],
            style,
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format_rate(v),
            (SegmentValue::CenterOf(i), v * 1.08),
            ("sans-serif", 13),
        )))?;
    }
    root.present()?;
    Ok(())
}

/// One series per system label (first-appearance order), points sorted by payload.
fn thr_series(records: &[Record], value: impl Fn(&Record) -> Option<f64>) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for r in records.iter().filter(|r| r.test == "thr") {
        let Some(v) = value(r).filter(|v| *v > 0.0) else {
            continue;
        };
        if r.payload_bytes == 0 {
            continue;
        }
        series_of(&mut out, r)
            .points
            .push((r.payload_bytes as f64, v));
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The series of `r`'s label in `out`, appended (empty) on first use; the raw baseline (mode
/// "raw") and iperf3 (mode "ideal") are ideal lines.
fn series_of<'a>(out: &'a mut Vec<Series>, r: &Record) -> &'a mut Series {
    let label = r.label();
    let i = match out.iter().position(|s| s.label == label) {
        Some(i) => i,
        None => {
            out.push(Series {
                label,
                points: Vec::new(),
                ideal: r.mode == "raw" || r.mode == "ideal",
                iperf: r.mode == "ideal",
            });
            out.len() - 1
        }
    };
    &mut out[i]
}

/// A log range covering `values`, widened so that a single value still makes a range.
fn log_bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() || hi <= 0.0 {
        return (1.0, 10.0);
    }
    (lo / 1.5, hi * 1.5)
}

/// "1.00 Gbit/s" -> "1 Gbit/s", "10.0 Gbit/s" -> "10 Gbit/s" (tick labels).
fn short(s: String) -> String {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, rest) = s.split_at(end);
    if num.contains('.') {
        format!("{}{rest}", num.trim_end_matches('0').trim_end_matches('.'))
    } else {
        s
    }
}

fn color(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
        RGBColor(0x17, 0xbe, 0xcf),
    ];
    COLORS[i % COLORS.len()]
}

/// The x axis of a line chart: its description and the label of a power of two.
struct XAxis {
    desc: &'static str,
    fmt: fn(f64) -> String,
}

const PAYLOAD_AXIS: XAxis = XAxis {
    desc: "payload",
    fmt: |v| format_size(v as usize),
};

fn line_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    series: &[Series],
    y_fmt: fn(f64) -> String,
    x_axis: &XAxis,
) -> anyhow::Result<()> {
    // x is log2(payload) on a linear axis so that ticks fall on powers of two.
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0.log2()));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    let (x0, x1) = if x0.is_finite() {
        (x0 - 0.3, x1 + 0.3)
    } else {
        (0.0, 1.0)
    };
    let (y0, y1) = log_bounds(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(100)
        .build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(x_axis.desc)
        .y_desc(y_desc)
        .x_labels(14)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                (x_axis.fmt)(2f64.powf(x.round()))
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| short(y_fmt(*y)))
        .draw()?;
    let mut next_color = 0;
    let has_iperf = series.iter().any(|s| s.iperf);
    for s in series {
        let style = if s.iperf {
            RGBColor(0x80, 0x80, 0x80)
        } else if s.ideal {
            BLACK
        } else {
            next_color += 1;
            color(next_color - 1)
        };
        let label = if s.iperf {
            s.label.clone()
        } else if s.ideal && !has_iperf {
            format!("{} = ideal", s.label)
        } else if s.ideal {
            format!("{} = one hop", s.label)
        } else {
            s.label.clone()
        };
        if s.ideal {
            chart
                .draw_series(DashedLineSeries::new(
                    s.points.iter().map(|&(x, y)| (x.log2(), y)),
                    8,
                    5,
                    style.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        } else {
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().map(|&(x, y)| (x.log2(), y)),
                    style.stroke_width(2),
                ))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart.draw_series(
            s.points
                .iter()
                .map(|&(x, y)| Circle::new((x.log2(), y), 3, style.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn lat_chart(path: &Path, records: &[Record]) -> anyhow::Result<()> {
    let lat: Vec<&Record> = records
        .iter()
        .filter(|r| r.test == "lat" && r.p50_us.is_some())
        .collect();
    let several_sizes = lat.iter().any(|r| r.payload_bytes != lat[0].payload_bytes);
    let values = |r: &Record| [r.p50_us, r.p99_us, r.p999_us].map(|v| v.unwrap_or(0.0));
    let (y0, y1) = log_bounds(lat.iter().flat_map(|r| values(r)).filter(|v| *v > 0.0));
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency (half round trip)", ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((0u32..3).into_segmented(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("percentile")
        .y_desc("µs")
        .x_label_formatter(&|v| {
            let i = match v {
                SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => *i,
                SegmentValue::Last => 3,
            };
            ["p50", "p99", "p99.9"]
                .get(i as usize)
                .unwrap_or(&"")
                .to_string()
        })
        .y_label_formatter(&|y| short(format!("{y:.1}")))
        .draw()?;
    let mut next_color = 0;
    for r in &lat {
        let style = if r.mode == "raw" {
            BLACK
        } else {
            next_color += 1;
            color(next_color - 1)
        };
        let pts: Vec<(SegmentValue<u32>, f64)> = values(r)
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(i, v)| (SegmentValue::CenterOf(i as u32), *v))
            .collect();
        let mut label = r.label();
        if several_sizes {
            label = format!("{label} {}", format_size(r.payload_bytes));
        }
        if let Some(p50) = r.p50_us {
            label = format!("{label}: p50 {p50:.1} µs");
        }
        chart
            .draw_series(LineSeries::new(pts.iter().cloned(), style.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, style.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_record as rec;

    #[test]
    fn writes_svg_charts() {
        let mut recs = Vec::new();
        for (i, p) in [8usize, 64, 1024, 65536].into_iter().enumerate() {
            let f = 1.0 + i as f64;
            recs.push(rec("hayate", "brokered", "thr", p, 3e6 / f));
            recs.push(rec("nats", "brokered", "thr", p, 2e6 / f));
            recs.push(rec("tcp", "raw", "thr", p, 9e6 / f));
        }
        for (sys, mode, p50) in [("hayate", "brokered", 20.0), ("tcp", "raw", 8.0)] {
            let mut r = rec(sys, mode, "lat", 64, 1e4);
            (r.p50_us, r.p99_us, r.p999_us) = (Some(p50), Some(p50 * 2.0), Some(p50 * 5.0));
            recs.push(r);
        }
        let dir = std::env::temp_dir().join(format!("hayate-bench-chart-{}", std::process::id()));
        let files = write_charts(&dir.join("run"), &recs).unwrap();
        assert_eq!(files.len(), 3);
        for f in &files {
            let svg = std::fs::read_to_string(f).unwrap();
            assert!(svg.starts_with("<svg"), "{}", f.display());
            assert!(svg.contains("<text"), "{}", f.display());
            assert!(svg.contains("hayate"), "{}", f.display());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
