//! The suite's report: `results.json` to read the numbers back, `results.md`
//! with one table per workload, and one plot per workload as SVG and, where
//! the machine has a font to draw its text, as PNG (`png`).
//!
//! Plots use plotters' SVG backend without its font features, so the bench
//! builds on machines without fontconfig: text becomes `<text>` elements laid
//! out by the viewer, and plotters only estimates their width (from the
//! character count) to place labels.

use super::png::Renderer;
use super::results::{Latency, Machine, Results, Run};
use anyhow::{Context, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::fmt::{self, Write as _};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The system the others are compared with in the ratio columns.
const BASELINE: &str = "lambdastore";

/// Missing cells: a system did not run that variant, or a number has no
/// meaning (the latency of zero completed operations).
const MISSING: &str = "—";

/// Numeric variants beyond this many are plotted as lines, not bars.
const MAX_BARS: usize = 8;

const FONT: &str = "sans-serif";

/// One colour per system in every plot; from the Tableau 10 palette.
const SYSTEM_COLORS: [(&str, RGBColor); 4] = [
    ("lambdastore", RGBColor(0x4e, 0x79, 0xa7)),
    ("disaggregated", RGBColor(0xf2, 0x8e, 0x2b)),
    ("plpgsql", RGBColor(0x59, 0xa1, 0x4f)),
    ("raw-sql", RGBColor(0xe1, 0x57, 0x59)),
];

/// Systems not in `SYSTEM_COLORS`, chosen from the name so that a system
/// keeps its colour from one plot to the next.
const OTHER_COLORS: [RGBColor; 6] = [
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];

/// Writes `results.json`, `results.md` and per workload `<workload>.svg`
/// and `<workload>.png` into `dir` (created if needed); returns the files in
/// that order. Without a font for the PNGs it says why and writes the SVGs.
pub fn write(results: &Results, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut files = Vec::new();
    let mut put = |name: &str, contents: &[u8]| -> Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, contents).with_context(|| format!("write {}", path.display()))?;
        files.push(path);
        Ok(())
    };
    put("results.json", (serde_json::to_string_pretty(results)? + "\n").as_bytes())?;
    put("results.md", markdown(results).as_bytes())?;
    let renderer = renderer();
    for workload in workloads(results) {
        let svg = plot(&workload).with_context(|| format!("plot {}", workload.name))?;
        files.extend(write_plot(dir, &plot_file(workload.name), &svg, renderer.as_ref())?);
    }
    Ok(files)
}

/// A timeline of `runs` (throughput per `timeline_step_s`) with `spans`
/// shaded, as `<stem>.svg` and `<stem>.png` in `dir`; returns the files.
/// Used outside the suite for a timeline made from pgbench's logs.
pub fn write_timeline(dir: &Path, stem: &str, title: &str, runs: &[Run], spans: &[Span]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let runs: Vec<&Run> = runs.iter().collect();
    let svg = timeline_plot(title, &runs, spans).with_context(|| format!("plot {stem}"))?;
    write_plot(dir, stem, &svg, renderer().as_ref())
}

/// The PNG renderer, or None (said why) where no font is found.
fn renderer() -> Option<Renderer> {
    Renderer::new().inspect_err(|why| eprintln!("plots as SVG only: {why}")).ok()
}

/// `<stem>.svg`, and `<stem>.png` when there is a renderer, in `dir`.
fn write_plot(dir: &Path, stem: &str, svg: &str, renderer: Option<&Renderer>) -> Result<Vec<PathBuf>> {
    let mut files = vec![dir.join(format!("{stem}.svg"))];
    std::fs::write(&files[0], svg).with_context(|| format!("write {}", files[0].display()))?;
    if let Some(renderer) = renderer {
        let path = dir.join(format!("{stem}.png"));
        let png = renderer.png(svg).with_context(|| format!("draw {stem}.png"))?;
        std::fs::write(&path, png).with_context(|| format!("write {}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

/// The report as markdown: the machine, the scale, then a table per
/// workload and a link to its plot. This is `results.md` as `write` leaves
/// it, so the links resolve next to the SVG files.
pub fn markdown(results: &Results) -> String {
    let mut md = String::from("# LambdaStore benchmark suite\n\n");
    header(&mut md, results).expect("writing to a String cannot fail");
    for workload in workloads(results) {
        section(&mut md, &workload).expect("writing to a String cannot fail");
    }
    md
}

fn header(md: &mut String, results: &Results) -> fmt::Result {
    let Machine { cpu_model, cpus, memory_gib, kernel, postgres } = &results.machine;
    let quick = if results.quick { "yes: short runs and scaled-down data, numbers are indicative only" } else { "no" };
    writeln!(md, "- **Started**: {}", results.started_at)?;
    writeln!(md, "- **Quick**: {quick}")?;
    writeln!(md, "- **CPU**: {cpu_model}, {cpus} CPUs")?;
    writeln!(md, "- **Memory**: {memory_gib:.1} GiB")?;
    writeln!(md, "- **Kernel**: {kernel}")?;
    writeln!(md, "- **PostgreSQL**: {postgres}\n")?;
    if !results.scale.is_empty() {
        writeln!(md, "## Scale\n")?;
        for line in &results.scale {
            writeln!(md, "- {line}")?;
        }
        writeln!(md)?;
    }
    if !results.findings.is_empty() {
        writeln!(md, "## Findings\n")?;
        for line in &results.findings {
            writeln!(md, "- {line}")?;
        }
        writeln!(md)?;
    }
    Ok(())
}

fn section(md: &mut String, w: &Workload) -> fmt::Result {
    writeln!(md, "### {}\n", w.name)?;
    let latency_only = w.latency_only();
    let mut setups: Vec<String> = Vec::new();
    for run in &w.runs {
        let setup = if latency_only {
            format!("{}, {} clients, {} samples", run.mode, run.clients, thousands(run.ops))
        } else {
            format!("{}, {} clients, {:.0} s measured", run.mode, run.clients, run.seconds)
        };
        if !setups.contains(&setup) {
            setups.push(setup);
        }
    }
    // Ratios only where the baseline ran: "lambdastore ÷ x" for every other x.
    let others: Vec<&str> = if w.systems.contains(&BASELINE) && !latency_only {
        w.systems.iter().copied().filter(|s| *s != BASELINE).collect()
    } else {
        Vec::new()
    };
    write!(md, "*{}.", setups.join("; "))?;
    if !others.is_empty() {
        write!(md, " Ratios are of throughput: above 1× {BASELINE} is faster.")?;
    }
    writeln!(md, "*\n")?;

    let mut head = vec!["variant".to_string()];
    let mut align = vec![":---"];
    for system in &w.systems {
        if !latency_only {
            head.push(format!("{system} ops/s"));
            align.push("---:");
        }
        head.push(format!("{system} p50 / p99 ms"));
        align.push("---:");
    }
    for other in &others {
        head.push(format!("{BASELINE} ÷ {other}"));
        align.push("---:");
    }
    head.push("retries / errors".to_string());
    align.push("---:");
    table_row(md, head.iter().map(String::as_str))?;
    table_row(md, align)?;

    for variant in &w.variants {
        let mut row = vec![escape_cell(variant)];
        let (mut retries, mut errors) = (0, 0);
        for system in &w.systems {
            match w.run(variant, system) {
                Some(run) => {
                    if !latency_only {
                        row.push(ops_per_s(run.throughput));
                    }
                    row.push(latency(run));
                    retries += run.retries;
                    errors += run.errors;
                }
                None => row.extend(vec![MISSING.to_string(); if latency_only { 1 } else { 2 }]),
            }
        }
        let baseline = w.run(variant, BASELINE);
        for other in &others {
            row.push(match (baseline, w.run(variant, other)) {
                (Some(a), Some(b)) => ratio(a.throughput, b.throughput),
                _ => MISSING.to_string(),
            });
        }
        row.push(format!("{} / {}", thousands(retries), thousands(errors)));
        table_row(md, row.iter().map(String::as_str))?;
    }
    writeln!(md)?;
    cpu_table(md, w, &others)?;

    // The column sums the systems: say which of them retried, and which run
    // lost operations for good.
    let per_system: Vec<String> = w
        .systems
        .iter()
        .filter_map(|system| {
            let runs = w.runs.iter().filter(|r| r.system == *system);
            let (retries, errors) = runs.fold((0, 0), |(r, e), run| (r + run.retries, e + run.errors));
            (retries + errors > 0).then(|| format!("{system} {} / {}", thousands(retries), thousands(errors)))
        })
        .collect();
    if !per_system.is_empty() {
        writeln!(md, "Retries / errors by system: {}.\n", per_system.join(", "))?;
    }
    let failed: Vec<&&Run> = w.runs.iter().filter(|r| r.errors > 0).collect();
    for run in &failed {
        writeln!(
            md,
            "- **{} errors** in {}, {}: operations that failed for good ({} completed).",
            thousands(run.errors),
            escape_cell(&run.variant),
            run.system,
            thousands(run.ops),
        )?;
    }
    if !failed.is_empty() {
        writeln!(md)?;
    }
    writeln!(md, "![{}]({}.svg)\n", w.name, plot_file(w.name))
}

/// CPU time per operation, where the runs measured it: client · server µs
/// for each system, and the server's against the baseline's, whose CPU
/// throughput on a machine shared by clients and server does not show.
fn cpu_table(md: &mut String, w: &Workload, others: &[&str]) -> fmt::Result {
    if !w.runs.iter().any(|r| r.cpu_us.is_some()) {
        return Ok(());
    }
    writeln!(md, "CPU per operation in the measured window, µs (client · server):\n")?;
    let mut head = vec!["variant".to_string()];
    head.extend(w.systems.iter().map(|system| system.to_string()));
    head.extend(others.iter().map(|other| format!("server: {BASELINE} ÷ {other}")));
    table_row(md, head.iter().map(String::as_str))?;
    table_row(md, std::iter::once(":---").chain(std::iter::repeat_n("---:", head.len() - 1)))?;
    for variant in &w.variants {
        let cpu = |system: &str| w.run(variant, system).and_then(|run| run.cpu_us);
        let mut row = vec![escape_cell(variant)];
        for system in &w.systems {
            row.push(cpu(system).map_or(MISSING.to_string(), |c| format!("{:.0} · {:.0}", c.client, c.server)));
        }
        for other in others {
            row.push(match (cpu(BASELINE), cpu(other)) {
                (Some(a), Some(b)) => ratio(a.server, b.server),
                _ => MISSING.to_string(),
            });
        }
        table_row(md, row.iter().map(String::as_str))?;
    }
    writeln!(md)
}

fn table_row<'a>(md: &mut String, cells: impl IntoIterator<Item = &'a str>) -> fmt::Result {
    md.push('|');
    for cell in cells {
        write!(md, " {cell} |")?;
    }
    writeln!(md)
}

/// A `|` would end the cell early.
fn escape_cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The runs of one workload, with its variants and systems in the order they
/// first appear in the results.
struct Workload<'a> {
    name: &'a str,
    runs: Vec<&'a Run>,
    variants: Vec<&'a str>,
    systems: Vec<&'a str>,
}

impl<'a> Workload<'a> {
    /// Samples taken one at a time with no measured duration (cold start):
    /// latencies, but no throughput to report, compare or plot.
    fn latency_only(&self) -> bool {
        self.runs.iter().all(|r| r.seconds == 0.0)
    }

    /// The first run of `system` on `variant`; a repeated run is in the JSON
    /// but not in the report.
    fn run(&self, variant: &str, system: &str) -> Option<&'a Run> {
        self.runs.iter().copied().find(|r| r.variant == variant && r.system == system)
    }
}

fn workloads(results: &Results) -> Vec<Workload<'_>> {
    // Systems keep one order across all tables, even where some are absent.
    let mut all_systems: Vec<&str> = Vec::new();
    let mut workloads: Vec<Workload> = Vec::new();
    for run in &results.runs {
        push_new(&mut all_systems, &run.system);
        let index = match workloads.iter().position(|w| w.name == run.workload) {
            Some(index) => index,
            None => {
                workloads.push(Workload { name: &run.workload, runs: vec![], variants: vec![], systems: vec![] });
                workloads.len() - 1
            }
        };
        let w = &mut workloads[index];
        w.runs.push(run);
        push_new(&mut w.variants, &run.variant);
    }
    for w in &mut workloads {
        w.systems = all_systems.iter().copied().filter(|s| w.runs.iter().any(|r| r.system == *s)).collect();
    }
    workloads
}

fn push_new<'a>(list: &mut Vec<&'a str>, item: &'a str) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// `12,345` from 100 ops/s up, `12.3` and `1.23` below, where the
/// fraction matters.
fn ops_per_s(value: f64) -> String {
    if !value.is_finite() {
        MISSING.to_string()
    } else if value == 0.0 || value.abs() >= 100.0 {
        thousands_f64(value)
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// p50 / p99 in milliseconds, or `—` if nothing completed.
fn latency(run: &Run) -> String {
    let Latency { p50, p99, .. } = &run.latency_us;
    if run.ops == 0 {
        return MISSING.to_string();
    }
    format!("{} / {}", millis(*p50), millis(*p99))
}

/// About three significant digits: `0.42`, `4.20`, `42.0`, `420`, `4,200`.
fn millis(us: f64) -> String {
    let ms = us / 1000.0;
    if !ms.is_finite() {
        MISSING.to_string()
    } else if ms.abs() >= 100.0 {
        thousands_f64(ms)
    } else if ms.abs() >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

/// `12.3×`; `—` if the denominator did nothing.
fn ratio(numerator: f64, denominator: f64) -> String {
    let r = numerator / denominator;
    if denominator <= 0.0 || !r.is_finite() {
        MISSING.to_string()
    } else if r >= 100.0 {
        format!("{}×", thousands_f64(r))
    } else if r >= 0.1 || r == 0.0 {
        format!("{r:.1}×")
    } else {
        format!("{r:.2}×")
    }
}

fn thousands_f64(value: f64) -> String {
    let rounded = value.abs().round() as u64;
    let sign = if value < 0.0 && rounded > 0 { "-" } else { "" };
    format!("{sign}{}", thousands(rounded))
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The plot's file name without its extension (`.svg`, `.png`).
/// The plot's file name without its extension (`.svg`, `.png`).
fn plot_file(workload: &str) -> String {
    workload.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect()
}

/// What each workload's plot shows.
enum Plot {
    /// Grouped bars: one group per variant, one bar per system.
    ThroughputBars,
    /// The same bars of p50 latency, for runs without a throughput.
    LatencyBars,
    /// Throughput against a numeric variant with too many values for bars.
    ThroughputLines,
    /// job-length: p50 latency against hash rounds, log-log.
    LatencyByRounds,
    /// faulty: throughput over time, one line per run.
    Timeline,
}

fn plot_kind(w: &Workload) -> Plot {
    if w.name == "job-length" && w.runs.iter().any(|r| r.x.is_some_and(|x| x > 0.0)) {
        Plot::LatencyByRounds
    } else if w.name == "faulty" && w.runs.iter().any(|r| !r.timeline.is_empty()) {
        Plot::Timeline
    } else if w.latency_only() {
        Plot::LatencyBars
    } else if w.variants.len() > MAX_BARS && w.runs.iter().all(|r| r.x.is_some()) {
        Plot::ThroughputLines
    } else {
        Plot::ThroughputBars
    }
}

fn plot(w: &Workload) -> Result<String> {
    match plot_kind(w) {
        Plot::ThroughputBars => bars(w, &THROUGHPUT),
        Plot::LatencyBars => bars(w, &P50_MS),
        Plot::ThroughputLines => throughput_lines(w),
        Plot::LatencyByRounds => latency_by_rounds(w),
        Plot::Timeline => timeline(w),
    }
}

/// The x axis of a numeric variant; the results do not carry its unit.
fn x_desc(workload: &str) -> &'static str {
    match workload {
        "rw-mix" => "writes (%)",
        "job-length" => "hash rounds n",
        _ => "variant",
    }
}

fn color(system: &str) -> RGBColor {
    match SYSTEM_COLORS.iter().find(|(name, _)| *name == system) {
        Some((_, color)) => *color,
        None => {
            let hash = system.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
            OTHER_COLORS[hash % OTHER_COLORS.len()]
        }
    }
}

/// How a legend entry is drawn.
enum Mark {
    Bar,
    /// A line with dots at the data points.
    Points,
    /// A line; `dash` indexes `DASHES`.
    Line {
        dash: usize,
    },
}

/// (dash, gap) in pixels; (0, 0) is a solid line.
const DASHES: [(u32, u32); 4] = [(0, 0), (10, 5), (3, 4), (14, 4)];

struct Entry {
    label: String,
    color: RGBColor,
    mark: Mark,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

const HEIGHT: u32 = 480;
const PLOT_WIDTH: u32 = 720;
const TITLE_SIZE: u32 = 24;
const LABEL_SIZE: u32 = 15;
const DESC_SIZE: u32 = 16;
const MAX_BAR_PX: f64 = 90.0;

/// A rough text width at `LABEL_SIZE`, to size the canvas (the viewer's font
/// is unknown).
fn text_width(text: &str) -> u32 {
    text.chars().count() as u32 * 7
}

/// Renders a titled SVG of a plot `plot_width` wide with the legend to its
/// right, where it cannot cover data.
fn render(title: &str, plot_width: u32, legend: &[Entry], draw: impl FnOnce(&Area) -> Result<()>) -> Result<String> {
    let legend_width = legend.iter().map(|e| text_width(&e.label)).max().unwrap_or(0).max(60) + 60;
    let width = (plot_width + legend_width).max(text_width(title) * 3 / 2 + 40);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)?;
        let body = root.titled(title, (FONT, TITLE_SIZE))?;
        let (chart, key) = body.split_horizontally(width - legend_width);
        draw(&chart)?;
        draw_legend(&key, legend)?;
        root.present()?;
    }
    Ok(svg)
}

fn draw_legend(area: &Area, entries: &[Entry]) -> Result<()> {
    let style = TextStyle::from((FONT, LABEL_SIZE)).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, entry) in entries.iter().enumerate() {
        let y = 30 + 24 * i as i32;
        let (x0, x1) = (8, 36);
        match entry.mark {
            Mark::Bar => area.draw(&Rectangle::new([(x0 + 6, y - 7), (x1 - 6, y + 7)], entry.color.filled()))?,
            Mark::Points => {
                area.draw(&PathElement::new(vec![(x0, y), (x1, y)], entry.color.stroke_width(2)))?;
                // Hollow, as `LineSeries::point_size` draws them.
                area.draw(&Circle::new(((x0 + x1) / 2, y), 4, entry.color.stroke_width(2)))?;
            }
            Mark::Line { dash } => {
                let (size, gap) = DASHES[dash % DASHES.len()];
                let style = entry.color.stroke_width(2);
                if size == 0 {
                    area.draw(&PathElement::new(vec![(x0, y), (x1, y)], style))?;
                } else {
                    area.draw(&DashedPathElement::new(vec![(x0, y), (x1, y)], size, gap, style))?;
                }
            }
        }
        area.draw(&Text::new(entry.label.clone(), (x1 + 8, y), style.clone()))?;
    }
    Ok(())
}

/// An empty plot says why, so that it does not read as a rendering fault.
fn note_if_empty(area: &Area, empty: bool) -> Result<()> {
    if empty {
        let (width, height) = area.dim_in_pixel();
        let grey = BLACK.mix(0.6);
        let style = TextStyle::from((FONT, DESC_SIZE)).color(&grey).pos(Pos::new(HPos::Center, VPos::Center));
        area.draw(&Text::new("no operations completed", (width as i32 / 2, height as i32 / 2), style))?;
    }
    Ok(())
}

/// `0..max` with headroom; `0..1` when there is nothing above zero, as
/// plotters needs a non-empty range.
/// A chart in `area` with the margins and label areas every plot uses.
fn chart_on<'a, 'b>(area: &'a Area<'b>) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder.margin(10).margin_right(20).x_label_area_size(50).y_label_area_size(70);
    builder
}

fn zero_to_max(values: impl Iterator<Item = f64>) -> Range<f64> {
    let max = values.filter(|v| v.is_finite()).fold(0.0, f64::max);
    if max > 0.0 {
        0.0..max * 1.1
    } else {
        0.0..1.0
    }
}

/// From the power of ten at or below the smallest value to the one at or
/// above the largest, so a log axis is labelled at both ends.
fn decades(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi == 0.0 {
        return 1.0..10.0;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    if hi > lo {
        lo..hi
    } else {
        lo..lo * 10.0
    }
}

/// Axis numbers: `800`, `1.5k`, `12k`, `2M`, `0.25`.
fn axis_number(value: f64) -> String {
    let (scaled, suffix) = match value.abs() {
        a if a >= 1e6 => (value / 1e6, "M"),
        a if a >= 1e3 => (value / 1e3, "k"),
        _ => (value, ""),
    };
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

/// What the bars of a bar plot measure.
struct BarMetric {
    title: &'static str,
    axis: &'static str,
    value: fn(&Run) -> f64,
}

const THROUGHPUT: BarMetric = BarMetric { title: "throughput", axis: "throughput (ops/s)", value: |r| r.throughput };

const P50_MS: BarMetric = BarMetric {
    title: "p50 latency",
    axis: "p50 latency (ms)",
    value: |r| {
        if r.ops > 0 {
            r.latency_us.p50 / 1000.0
        } else {
            0.0
        }
    },
};

fn bars(w: &Workload, metric: &BarMetric) -> Result<String> {
    let value = |r: &Run| {
        let v = (metric.value)(r);
        if v.is_finite() {
            v.max(0.0)
        } else {
            0.0
        }
    };
    let systems = w.systems.len().max(1);
    let longest = w.variants.iter().map(|v| text_width(v)).max().unwrap_or(0);
    let group_width = (systems as u32 * 28 + 30).max(longest + 16);
    let plot_width = (w.variants.len() as u32 * group_width + 110).max(PLOT_WIDTH);
    let legend: Vec<Entry> =
        w.systems.iter().map(|s| Entry { label: s.to_string(), color: color(s), mark: Mark::Bar }).collect();

    render(&format!("{}: {}", w.name, metric.title), plot_width, &legend, |area| {
        let n = w.variants.len();
        let y = zero_to_max(w.runs.iter().map(|r| value(r)));
        let mut chart = chart_on(area).build_cartesian_2d(VariantAxis(n), y)?;
        let label = |x: &f64| w.variants.get(x.floor() as usize).map(|v| v.to_string()).unwrap_or_default();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&label)
            .y_label_formatter(&|y| axis_number(*y))
            .x_desc("variant")
            .y_desc(metric.axis)
            .label_style((FONT, LABEL_SIZE))
            .axis_desc_style((FONT, DESC_SIZE))
            .max_light_lines(1)
            .draw()?;

        // Bars at most MAX_BAR_PX wide (in x units: a variant's share of
        // the plot), each group centred on its variant.
        let unit_px = f64::from(plot_width - 110) / n.max(1) as f64;
        let bar = (0.8 / systems as f64).min(MAX_BAR_PX / unit_px);
        let first = 0.5 - bar * systems as f64 / 2.0;
        for (j, system) in w.systems.iter().enumerate() {
            let style = color(system).filled();
            let bars = w.variants.iter().enumerate().filter_map(|(i, variant)| {
                let run = w.run(variant, system)?;
                let x0 = i as f64 + first + j as f64 * bar;
                Some(Rectangle::new([(x0, 0.0), (x0 + bar * 0.92, value(run))], style))
            });
            chart.draw_series(bars)?;
        }
        note_if_empty(area, !w.runs.iter().any(|r| value(r) > 0.0))
    })
}

/// A categorical x axis: one unit per variant, ticked at its centre.
/// (`with_key_points` on an `f64` range would do, but loses the value
/// formatter that `configure_mesh` requires.)
struct VariantAxis(usize);

impl Ranged for VariantAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let units = self.0.max(1) as f64;
        limit.0 + ((limit.1 - limit.0) as f64 * value / units).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0.max(1) as f64
    }
}

fn throughput_lines(w: &Workload) -> Result<String> {
    let legend: Vec<Entry> =
        w.systems.iter().map(|s| Entry { label: s.to_string(), color: color(s), mark: Mark::Points }).collect();
    render(&format!("{}: throughput", w.name), PLOT_WIDTH, &legend, |area| {
        let xs = || w.runs.iter().filter_map(|r| r.x).filter(|x| x.is_finite());
        let lo = xs().fold(f64::INFINITY, f64::min);
        let hi = xs().fold(f64::NEG_INFINITY, f64::max);
        let x = if lo < hi {
            lo..hi
        } else if lo.is_finite() {
            lo - 1.0..lo + 1.0
        } else {
            0.0..1.0
        };
        let y = zero_to_max(w.runs.iter().map(|r| r.throughput));
        let mut chart = chart_on(area).build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| axis_number(*x))
            .y_label_formatter(&|y| axis_number(*y))
            .x_desc(x_desc(w.name))
            .y_desc("throughput (ops/s)")
            .label_style((FONT, LABEL_SIZE))
            .axis_desc_style((FONT, DESC_SIZE))
            .max_light_lines(1)
            .draw()?;
        for system in &w.systems {
            let line = series(w, system, |r| Some((r.x?, r.throughput)));
            chart.draw_series(LineSeries::new(line, color(system).stroke_width(2)).point_size(4))?;
        }
        note_if_empty(area, !w.runs.iter().any(|r| r.throughput > 0.0))
    })
}

fn latency_by_rounds(w: &Workload) -> Result<String> {
    // A log axis has no place for zero: runs that completed nothing are left out.
    let point = |r: &Run| {
        let x = r.x.filter(|x| x.is_finite() && *x > 0.0)?;
        let p50 = r.latency_us.p50;
        (r.ops > 0 && p50.is_finite() && p50 > 0.0).then_some((x, p50))
    };
    let legend: Vec<Entry> =
        w.systems.iter().map(|s| Entry { label: s.to_string(), color: color(s), mark: Mark::Points }).collect();
    let title = format!("{}: p50 latency by job length", w.name);
    render(&title, PLOT_WIDTH, &legend, |area| {
        let points: Vec<(f64, f64)> = w.runs.iter().filter_map(|r| point(r)).collect();
        let x = decades(points.iter().map(|p| p.0)).log_scale();
        let y = decades(points.iter().map(|p| p.1)).log_scale();
        let mut chart = chart_on(area).build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| axis_number(*x))
            .y_label_formatter(&|y| axis_number(*y))
            .x_desc(format!("{} (log)", x_desc(w.name)))
            .y_desc("p50 latency (µs, log)")
            .label_style((FONT, LABEL_SIZE))
            .axis_desc_style((FONT, DESC_SIZE))
            .draw()?;
        for system in &w.systems {
            let line = series(w, system, point);
            chart.draw_series(LineSeries::new(line, color(system).stroke_width(2)).point_size(4))?;
        }
        note_if_empty(area, points.is_empty())
    })
}

/// The points of one system's runs, in x order.
fn series(w: &Workload, system: &str, point: impl Fn(&Run) -> Option<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = w
        .runs
        .iter()
        .filter(|r| r.system == system)
        .filter_map(|r| point(r))
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

/// A stretch of time marked on a timeline (e.g. an object's migration):
/// shaded from `from_s` to `to_s`, seconds from the timeline's start, and
/// labelled at the top.
pub struct Span {
    pub label: String,
    pub from_s: f64,
    pub to_s: f64,
}

/// Spans are shaded in this grey, their edges drawn in a darker one.
const SPAN_COLOR: RGBColor = RGBColor(0xc8, 0xc8, 0xc8);

fn timeline(w: &Workload) -> Result<String> {
    let runs: Vec<&Run> = w.runs.iter().copied().filter(|r| !r.timeline.is_empty()).collect();
    timeline_plot(&format!("{}: throughput over time", w.name), &runs, &[])
}

fn timeline_plot(title: &str, runs: &[&Run], spans: &[Span]) -> Result<String> {
    // A system's runs share its colour and differ in dashes.
    let dashes: Vec<usize> =
        runs.iter().enumerate().map(|(i, run)| runs[..i].iter().filter(|r| r.system == run.system).count()).collect();
    let entries: Vec<Entry> = runs
        .iter()
        .zip(&dashes)
        .map(|(run, dash)| Entry {
            label: format!("{}: {}", run.system, run.variant),
            color: color(&run.system),
            mark: Mark::Line { dash: *dash },
        })
        .chain(spans.first().map(|_| Entry {
            label: "shaded: marked spans".into(),
            color: SPAN_COLOR,
            mark: Mark::Bar,
        }))
        .collect();
    let step = |r: &Run| {
        if r.timeline_step_s > 0.0 {
            r.timeline_step_s
        } else {
            1.0
        }
    };

    render(title, PLOT_WIDTH, &entries, |area| {
        let end = runs.iter().map(|r| step(r) * r.timeline.len() as f64).fold(0.0, f64::max);
        let x = 0.0..if end > 0.0 { end } else { 1.0 };
        let y = zero_to_max(runs.iter().flat_map(|r| r.timeline.iter().copied()));
        let top = y.end;
        let mut chart = chart_on(area).build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_label_formatter(&|x| axis_number(*x))
            .y_label_formatter(&|y| axis_number(*y))
            .x_desc("time (s)")
            .y_desc("throughput (ops/s)")
            .label_style((FONT, LABEL_SIZE))
            .axis_desc_style((FONT, DESC_SIZE))
            .max_light_lines(1)
            .draw()?;
        // Under the lines, so that they stay visible across a span.
        let edge = BLACK.mix(0.35);
        let label = TextStyle::from((FONT, LABEL_SIZE)).color(&edge).pos(Pos::new(HPos::Left, VPos::Top));
        for span in spans {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(span.from_s, 0.0), (span.to_s, top)],
                SPAN_COLOR.filled(),
            )))?;
            for x in [span.from_s, span.to_s] {
                chart.draw_series(std::iter::once(PathElement::new(vec![(x, 0.0), (x, top)], edge.stroke_width(1))))?;
            }
            chart.draw_series(std::iter::once(Text::new(span.label.clone(), (span.to_s, top), label.clone())))?;
        }
        for ((run, entry), dash) in runs.iter().zip(&entries).zip(&dashes) {
            let points: Vec<(f64, f64)> = run
                .timeline
                .iter()
                .enumerate()
                // A slice's rate at its middle, so that a stall shows where
                // it happened and not half a slice early.
                .map(|(i, v)| ((i as f64 + 0.5) * step(run), if v.is_finite() { *v } else { 0.0 }))
                .collect();
            let style = entry.color.stroke_width(2);
            match DASHES[dash % DASHES.len()] {
                (0, _) => chart.draw_series(LineSeries::new(points, style))?,
                (size, gap) => chart.draw_series(DashedLineSeries::new(points, size, gap, style))?,
            };
        }
        note_if_empty(area, !runs.iter().flat_map(|r| &r.timeline).any(|v| *v > 0.0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::results::CpuPerOp;

    fn run(workload: &str, variant: &str, x: Option<f64>, system: &str, throughput: f64) -> Run {
        Run {
            workload: workload.into(),
            variant: variant.into(),
            x,
            system: system.into(),
            mode: "closed".into(),
            clients: 8,
            seconds: 10.0,
            ops: (throughput * 10.0) as u64,
            throughput,
            errors: 0,
            retries: 0,
            latency_us: Latency { p50: 1_500.0, p90: 2_000.0, p99: 12_345.0, max: 20_000.0, mean: 1_600.0 },
            timeline: vec![],
            timeline_step_s: 0.0,
            cpu_us: None,
        }
    }

    /// The workloads of `results()`, in the order they first ran.
    const WORKLOADS: [&str; 6] = ["rw-mix", "job-length", "faulty", "cold-start", "retwis", "cloudforum"];

    /// Several workloads as the suite produces them, with the awkward cases:
    /// a workload without the baseline on every variant, one with a single
    /// system, one where nothing completed.
    fn results() -> Results {
        let mut runs = Vec::new();
        for (variant, x) in [("0% writes", 0.0), ("25% writes", 25.0)] {
            runs.push(run("rw-mix", variant, Some(x), "lambdastore", 1000.0));
            runs.push(run("rw-mix", variant, Some(x), "disaggregated", 250.0));
            runs.push(run("rw-mix", variant, Some(x), "plpgsql", 500.0));
        }
        // plpgsql retried serialization failures and gave up on three.
        let contended = runs.iter_mut().find(|r| r.variant == "25% writes" && r.system == "plpgsql").unwrap();
        contended.retries = 1_234;
        contended.errors = 3;
        // raw-sql ran only the first variant.
        runs.push(run("rw-mix", "0% writes", Some(0.0), "raw-sql", 12_345.0));

        for n in [1.0, 100.0, 10_000.0] {
            for (system, per_round_us) in [("lambdastore", 1.0), ("plpgsql", 30.0)] {
                let mut r = run("job-length", &format!("n = {n}"), Some(n), system, 100.0);
                r.latency_us.p50 = 200.0 + n * per_round_us;
                runs.push(r);
            }
        }
        for (system, variant) in
            [("lambdastore", "kill a worker"), ("lambdastore", "restart"), ("plpgsql", "kill a worker")]
        {
            let mut r = run("faulty", variant, None, system, 800.0);
            r.timeline = vec![900.0, 880.0, 0.0, 450.0, 870.0];
            r.timeline_step_s = 0.5;
            runs.push(r);
        }
        // Cold start: 200 samples taken one at a time, no throughput.
        for (system, cold_us) in [("lambdastore", 1_700.0), ("plpgsql", 1_400.0)] {
            for (variant, p50) in [("cold call", cold_us), ("warm call", 150.0)] {
                let mut r = run("cold-start", variant, None, system, 0.0);
                (r.mode, r.clients, r.seconds, r.ops) = ("sequential".into(), 1, 0.0, 200);
                r.latency_us.p50 = p50;
                runs.push(r);
            }
        }
        let mut dead = run("retwis", "post", None, "lambdastore", 0.0);
        dead.errors = 7;
        runs.push(dead);
        runs.push(run("retwis", "post", None, "plpgsql", 0.0));
        runs.push(run("cloudforum", "90/10", None, "lambdastore", 40.0));

        Results {
            machine: Machine {
                cpu_model: "Test CPU 9000".into(),
                cpus: 16,
                memory_gib: 62.8,
                kernel: "Linux 6.1.0".into(),
                postgres: "PostgreSQL 17.2".into(),
            },
            started_at: "2025-01-02T03:04:05Z".into(),
            quick: true,
            scale: vec!["rw-mix: 2,000 objects x 100 entries x 1 KiB".into()],
            findings: vec!["faulty, lambdastore: back to 90% of the earlier throughput 1.2 s after the fault".into()],
            runs,
        }
    }

    /// A fresh, empty directory per test.
    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lambdastore-report-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// The markdown table row whose first cell is `variant`, under `### workload`.
    fn row(md: &str, workload: &str, variant: &str) -> Vec<String> {
        let section = md.split(&format!("### {workload}\n")).nth(1).expect("section");
        let section = section.split("\n### ").next().unwrap();
        let line = section
            .lines()
            .find(|l| l.starts_with(&format!("| {variant} |")))
            .unwrap_or_else(|| panic!("no row {variant} in {workload}:\n{section}"));
        line.trim_matches('|').split(" | ").map(|c| c.trim().to_string()).collect()
    }

    fn header_row(md: &str, workload: &str) -> Vec<String> {
        row(md, workload, "variant")
    }

    #[test]
    fn header_names_the_machine_and_the_scale() {
        let md = markdown(&results());
        for expected in [
            "Test CPU 9000, 16 CPUs",
            "62.8 GiB",
            "Linux 6.1.0",
            "PostgreSQL 17.2",
            "2025-01-02T03:04:05Z",
            "**Quick**: yes",
            "- rw-mix: 2,000 objects x 100 entries x 1 KiB",
        ] {
            assert!(md.contains(expected), "missing {expected:?} in\n{md}");
        }
    }

    #[test]
    fn cpu_per_operation_gets_a_table_of_its_own_with_the_servers_ratio() {
        let mut results = results();
        assert!(!markdown(&results).contains("CPU per operation"), "a table with nothing measured");
        for r in results.runs.iter_mut().filter(|r| r.workload == "rw-mix" && r.variant == "0% writes") {
            let server = if r.system == "lambdastore" { 150.0 } else { 100.0 };
            r.cpu_us = Some(CpuPerOp { client: 20.0, server });
        }
        let md = markdown(&results);
        let section = md.split("### rw-mix\n").nth(1).unwrap().split("CPU per operation").nth(1).expect("a CPU table");
        let line = section.lines().find(|l| l.starts_with("| 0% writes |")).expect("its row");
        assert!(line.contains("| 20 · 150 |"), "{line}");
        assert!(line.contains("| 1.5× |"), "{line}");
    }

    #[test]
    fn sections_follow_the_order_workloads_first_ran() {
        let md = markdown(&results());
        let order: Vec<&str> = md.lines().filter_map(|l| l.strip_prefix("### ")).collect();
        assert_eq!(order, WORKLOADS);
    }

    #[test]
    fn table_has_a_column_pair_per_system_and_a_ratio_per_other_system() {
        let md = markdown(&results());
        assert_eq!(
            header_row(&md, "rw-mix"),
            [
                "variant",
                "lambdastore ops/s",
                "lambdastore p50 / p99 ms",
                "disaggregated ops/s",
                "disaggregated p50 / p99 ms",
                "plpgsql ops/s",
                "plpgsql p50 / p99 ms",
                "raw-sql ops/s",
                "raw-sql p50 / p99 ms",
                "lambdastore ÷ disaggregated",
                "lambdastore ÷ plpgsql",
                "lambdastore ÷ raw-sql",
                "retries / errors",
            ]
        );
    }

    #[test]
    fn rows_show_throughput_latency_and_ratios() {
        let md = markdown(&results());
        assert_eq!(
            row(&md, "rw-mix", "0% writes"),
            [
                "0% writes",
                "1,000",
                "1.50 / 12.3",
                "250",
                "1.50 / 12.3",
                "500",
                "1.50 / 12.3",
                "12,345",
                "1.50 / 12.3",
                "4.0×",
                "2.0×",
                "0.08×",
                "0 / 0",
            ]
        );
    }

    #[test]
    fn a_system_that_skipped_a_variant_leaves_dashes() {
        let md = markdown(&results());
        let cells = row(&md, "rw-mix", "25% writes");
        assert_eq!(cells[7..9], ["—", "—"], "raw-sql cells: {cells:?}");
        assert_eq!(cells[11], "—", "lambdastore ÷ raw-sql: {cells:?}");
    }

    #[test]
    fn retries_and_errors_are_summed_per_row_and_listed_per_run() {
        let md = markdown(&results());
        assert_eq!(row(&md, "rw-mix", "25% writes").last().unwrap(), "1,234 / 3");
        assert!(md.contains("Retries / errors by system: plpgsql 1,234 / 3.\n"), "{md}");
        assert!(
            md.contains("- **3 errors** in 25% writes, plpgsql: operations that failed for good (5,000 completed)."),
            "{md}"
        );
    }

    #[test]
    fn a_single_system_has_no_ratio_columns() {
        let md = markdown(&results());
        assert_eq!(header_row(&md, "cloudforum").len(), 4);
        assert_eq!(row(&md, "cloudforum", "90/10"), ["90/10", "40.0", "1.50 / 12.3", "0 / 0"]);
    }

    #[test]
    fn samples_without_a_duration_show_latency_only() {
        let md = markdown(&results());
        assert!(md.contains("*sequential, 1 clients, 200 samples.*"), "{md}");
        assert_eq!(
            header_row(&md, "cold-start"),
            ["variant", "lambdastore p50 / p99 ms", "plpgsql p50 / p99 ms", "retries / errors"]
        );
        assert_eq!(row(&md, "cold-start", "cold call"), ["cold call", "1.70 / 12.3", "1.40 / 12.3", "0 / 0"]);
    }

    #[test]
    fn zero_throughput_shows_zero_and_no_latency_or_ratio() {
        let md = markdown(&results());
        assert_eq!(row(&md, "retwis", "post"), ["post", "0", "—", "0", "—", "—", "0 / 7"]);
    }

    #[test]
    fn each_workload_links_its_plot() {
        let md = markdown(&results());
        for workload in WORKLOADS {
            assert!(md.contains(&format!("![{workload}]({workload}.svg)")), "{workload}");
        }
    }

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(ops_per_s(12_345.4), "12,345");
        assert_eq!(ops_per_s(2.5), "2.50");
        assert_eq!(millis(420.0), "0.42");
        assert_eq!(millis(1_234_567.0), "1,235");
        assert_eq!(ratio(1000.0, 500.0), "2.0×");
        assert_eq!(ratio(12_345.0, 1.0), "12,345×");
        assert_eq!(ratio(1.0, 0.0), "—");
        assert_eq!(axis_number(1_500.0), "1.5k");
        assert_eq!(axis_number(2_000_000.0), "2M");
        assert_eq!(axis_number(0.25), "0.25");
    }

    /// Whether this machine can draw PNG plots. Where PNGs are required
    /// (`LAMBDASTORE_REQUIRE_FONTS`, set by `make test`), a missing font
    /// fails the test instead of quietly testing the SVG-only path.
    fn fonts_for_png() -> bool {
        match Renderer::new() {
            Ok(_) => true,
            Err(why) if std::env::var_os("LAMBDASTORE_REQUIRE_FONTS").is_some() => {
                panic!("LAMBDASTORE_REQUIRE_FONTS is set but {why}")
            }
            Err(why) => {
                eprintln!("PNG checks skipped: {why}");
                false
            }
        }
    }

    #[test]
    fn write_leaves_json_markdown_and_a_plot_per_workload() {
        let dir = temp_dir("write");
        let results = results();
        let files = write(&results, &dir).unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        let mut expected = vec!["results.json".to_string(), "results.md".to_string()];
        let pngs = fonts_for_png();
        for workload in WORKLOADS {
            expected.push(format!("{workload}.svg"));
            if pngs {
                expected.push(format!("{workload}.png"));
            }
        }
        assert_eq!(names, expected);
        for file in &files {
            assert!(file.starts_with(&dir) && file.is_file(), "{}", file.display());
        }
        let json: Results = serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
        assert_eq!(json.runs.len(), results.runs.len());
        assert_eq!(std::fs::read_to_string(dir.join("results.md")).unwrap(), markdown(&results));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The RGBA pixels of a PNG, with its width and height.
    fn pixels(png: &[u8]) -> (u32, u32, Vec<[u8; 4]>) {
        let pixmap = resvg::tiny_skia::Pixmap::decode_png(png).expect("a PNG");
        let rgba = pixmap
            .pixels()
            .iter()
            .map(|p| {
                let c = p.demultiply();
                [c.red(), c.green(), c.blue(), c.alpha()]
            })
            .collect();
        (pixmap.width(), pixmap.height(), rgba)
    }

    fn dark(pixels: &[[u8; 4]]) -> usize {
        pixels.iter().filter(|[r, g, b, a]| *a > 0 && u16::from(*r) + u16::from(*g) + u16::from(*b) < 200).count()
    }

    #[test]
    fn a_png_plot_is_the_svg_drawn_with_its_labels() {
        if !fonts_for_png() {
            return;
        }
        let dir = temp_dir("png");
        write(&results(), &dir).unwrap();
        let svg = svg(&dir, "rw-mix.svg");
        let png = std::fs::read(dir.join("rw-mix.png")).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "PNG signature");
        let (width, height, rgba) = pixels(&png);
        let attribute = |name: &str| -> u32 {
            let after = svg.split(&format!(" {name}=\"")).nth(1).unwrap();
            after.split('"').next().unwrap().parse().unwrap()
        };
        assert_eq!((width, height), (attribute("width"), attribute("height")));
        for (system, colour) in SYSTEM_COLORS {
            let RGBColor(r, g, b) = colour;
            assert!(rgba.contains(&[r, g, b, 255]), "{system}'s colour is drawn");
        }
        // The same plot without its text: the labels are what the font adds.
        let mut textless = String::new();
        let mut rest = svg.as_str();
        while let Some(start) = rest.find("<text") {
            textless.push_str(&rest[..start]);
            let end = rest[start..].find("</text>").unwrap() + start + "</text>".len();
            rest = &rest[end..];
        }
        textless.push_str(rest);
        let (_, _, bare) = pixels(&Renderer::new().unwrap().png(&textless).unwrap());
        let added = dark(&rgba).saturating_sub(dark(&bare));
        assert!(added > 1000, "text adds {added} dark pixels");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A plot as its text: what a browser would show, so `starts_with("<svg")`.
    fn svg(dir: &Path, name: &str) -> String {
        let svg = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(svg.starts_with("<svg"), "{name} starts with {:?}", &svg[..svg.len().min(40)]);
        assert!(svg.trim_end().ends_with("</svg>"), "{name} is complete");
        svg
    }

    /// Whether some `<text>` element of `svg` reads `text`.
    fn has_text(svg: &str, text: &str) -> bool {
        svg.split("<text ").skip(1).any(|element| {
            let content = element.split_once('>').map_or("", |(_, rest)| rest);
            content.split("</text>").next().unwrap_or("").trim() == text
        })
    }

    #[test]
    fn plots_carry_titles_axis_labels_and_legends() {
        let dir = temp_dir("plots");
        write(&results(), &dir).unwrap();
        let expected: [(&str, &[&str]); 5] = [
            (
                "rw-mix.svg",
                &[
                    "rw-mix: throughput",
                    "variant",
                    "throughput (ops/s)",
                    "0% writes",
                    "25% writes",
                    "lambdastore",
                    "disaggregated",
                    "plpgsql",
                    "raw-sql",
                ],
            ),
            (
                "job-length.svg",
                &[
                    "job-length: p50 latency by job length",
                    "hash rounds n (log)",
                    "p50 latency (µs, log)",
                    "lambdastore",
                    "plpgsql",
                ],
            ),
            (
                "faulty.svg",
                &[
                    "faulty: throughput over time",
                    "time (s)",
                    "throughput (ops/s)",
                    "lambdastore: kill a worker",
                    "lambdastore: restart",
                    "plpgsql: kill a worker",
                ],
            ),
            (
                "cold-start.svg",
                &["cold-start: p50 latency", "p50 latency (ms)", "warm call", "cold call", "lambdastore", "plpgsql"],
            ),
            ("retwis.svg", &["retwis: throughput", "post", "lambdastore", "plpgsql"]),
        ];
        for (name, texts) in expected {
            let svg = svg(&dir, name);
            for text in texts {
                assert!(has_text(&svg, text), "{name} lacks the text {text:?}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// How many `<tag` elements of `svg` are drawn in `hex` (fill or stroke).
    fn in_colour(svg: &str, tag: &str, hex: &str) -> usize {
        let colour = format!("=\"#{hex}\"");
        svg.split(&format!("<{tag} ")).skip(1).filter(|e| e.split('>').next().unwrap().contains(&colour)).count()
    }

    #[test]
    fn bars_are_drawn_in_each_systems_colour() {
        let dir = temp_dir("bars");
        write(&results(), &dir).unwrap();
        let svg = svg(&dir, "rw-mix.svg");
        // Two variants plus the legend key; raw-sql ran one variant.
        assert_eq!(in_colour(&svg, "rect", "4E79A7"), 3, "lambdastore");
        assert_eq!(in_colour(&svg, "rect", "59A14F"), 3, "plpgsql");
        assert_eq!(in_colour(&svg, "rect", "E15759"), 2, "raw-sql");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn line_plots_draw_a_line_per_system_or_run() {
        let dir = temp_dir("lines");
        write(&results(), &dir).unwrap();
        let job_length = svg(&dir, "job-length.svg");
        // The line and the legend key, and a dot per job length.
        assert_eq!(in_colour(&job_length, "polyline", "4E79A7"), 2);
        assert_eq!(in_colour(&job_length, "circle", "4E79A7"), 3 + 1);
        let faulty = svg(&dir, "faulty.svg");
        // Two lambdastore runs (one dashed) and their legend keys.
        assert!(in_colour(&faulty, "polyline", "4E79A7") >= 4);
        assert!(in_colour(&faulty, "polyline", "59A14F") >= 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn many_numeric_variants_plot_as_lines() {
        let mut results = results();
        results.runs = (0..=100)
            .step_by(10)
            .flat_map(|w| {
                let variant = format!("{w}% writes");
                [
                    run("rw-mix", &variant, Some(w as f64), "lambdastore", 1000.0 - w as f64),
                    run("rw-mix", &variant, Some(w as f64), "plpgsql", 500.0),
                ]
            })
            .collect();
        let dir = temp_dir("numeric");
        write(&results, &dir).unwrap();
        let svg = svg(&dir, "rw-mix.svg");
        for text in ["rw-mix: throughput", "writes (%)", "throughput (ops/s)", "lambdastore", "plpgsql"] {
            assert!(has_text(&svg, text), "lacks {text:?}");
        }
        assert_eq!(in_colour(&svg, "circle", "4E79A7"), 11 + 1, "a dot per variant and the legend's");
        assert_eq!(in_colour(&svg, "rect", "4E79A7"), 0, "no bars");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn plots_survive_one_bar_and_no_data() {
        let mut results = results();
        results.runs = vec![run("lonely", "only", None, "lambdastore", 0.0)];
        let mut empty = run("job-length", "n = 1", Some(1.0), "plpgsql", 0.0);
        empty.ops = 0;
        results.runs.push(empty);
        let mut flat = run("faulty", "kill", None, "lambdastore", 0.0);
        flat.timeline = vec![0.0];
        results.runs.push(flat);
        let dir = temp_dir("degenerate");
        write(&results, &dir).unwrap();
        for (name, legend) in
            [("lonely.svg", "lambdastore"), ("job-length.svg", "plpgsql"), ("faulty.svg", "lambdastore: kill")]
        {
            let svg = svg(&dir, name);
            assert!(has_text(&svg, legend), "{name} keeps its legend");
            assert!(has_text(&svg, "no operations completed"), "{name} says it is empty");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
