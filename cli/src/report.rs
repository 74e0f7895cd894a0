//! A job's report: `index.html` with the job's summary, its gate table and six SVG charts of its
//! metrics, written into one directory that a browser opens with no network and no fonts.
//!
//! The input is the API's typed job and metrics lines (`rlvr_protocol`): every figure of a
//! [`MetricsLine`] is optional, because SFT jobs and old jobs log few of them, so a missing one
//! costs a point or a chart, never the report. Each criterion of the gate table shows its
//! [`Status`] as `rlvrctl gates` does, by the same `Status::label`.
//!
//! Only SVG is written. A PNG needs plotters' bitmap backend, and drawing text on a bitmap needs a
//! font: plotters' `ttf` feature finds system fonts through fontconfig (absent on a bare Debian
//! host), `ab_glyph` needs a TTF file shipped with us, and with neither plotters panics the first
//! time it draws a label. SVG text is `<text>` elements the browser sets in its own sans-serif,
//! so with `default-features = false` plotters needs no font at build or run time (its layout
//! uses a fixed estimate of glyph widths).
//!
//! Every file is written to a temporary name in the directory and renamed into place, plots before
//! `index.html`, so a reader never sees a half-written file nor an index naming a missing plot.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use rlvr_protocol::gates::{GateReport, Status};
use rlvr_protocol::job::JobView;
use rlvr_protocol::signals::{GroupSignals, GroupWarning};
use rlvr_protocol::worker::{Baseline, BaselineKind, MetricsLine};

/// The files of one rendered report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `<out>/index.html`.
    pub index: PathBuf,
    /// The charts that had data, in the order the page shows them.
    pub plots: Vec<PathBuf>,
}

/// Why a report could not be written; each variant names the file or chart at fault.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The output directory could not be created.
    #[error("cannot create report directory {path}")]
    CreateDir { path: PathBuf, source: io::Error },
    /// A file of the report could not be written (or renamed into place).
    #[error("cannot write {path}")]
    Write { path: PathBuf, source: io::Error },
    /// A plot left by an earlier render, whose chart now has no data, could not be removed.
    #[error("cannot remove stale plot {path}")]
    Remove { path: PathBuf, source: io::Error },
    /// plotters failed to draw a chart (`chart` is its file name).
    #[error("cannot draw {chart}: {message}")]
    Plot { chart: &'static str, message: String },
}

/// Renders the report of `job` and its `metrics` lines into `out`.
///
/// `out` is created if missing. Charts with no data at all are not written, and a plot of that
/// name left by an earlier render is removed; the page says which charts had no data.
///
/// # Errors
///
/// When the directory cannot be created, a file cannot be written or a stale plot removed
/// (`CreateDir`, `Write`, `Remove`, with the path), or plotters fails to draw a chart (`Plot`).
/// Missing figures in `metrics` are never errors.
pub fn write(out: &Path, job: &JobView, metrics: &[MetricsLine]) -> Result<Report, ReportError> {
    // Every chart spans the job's steps, so the charts line up one under the other and a held-out
    // score at step 0 alone is a point at the start, not a chart of its own scale.
    let steps = axis_range(metrics.iter().map(|line| line.step as f64), 1.0);
    // Draw everything in memory first: a chart that fails to draw leaves the directory untouched.
    let mut rendered = Vec::with_capacity(Chart::ALL.len());
    for chart in Chart::ALL {
        let series = chart.series(metrics);
        let drawn = if series.is_empty() {
            None
        } else {
            let bucket = series.iter().map(|s| s.bucket).max().unwrap_or(1);
            Some((draw(chart, steps.clone(), &series)?, bucket))
        };
        rendered.push((chart, drawn));
    }

    fs::create_dir_all(out).map_err(|source| ReportError::CreateDir { path: out.to_owned(), source })?;
    let mut plots = Vec::new();
    for (chart, drawn) in &rendered {
        match drawn {
            Some((svg, _)) => plots.push(write_atomic(out, chart.file(), svg.as_bytes())?),
            None => remove_stale(&out.join(chart.file()))?,
        }
    }
    let page: Vec<(Chart, Option<usize>)> =
        rendered.iter().map(|(chart, drawn)| (*chart, drawn.as_ref().map(|(_, bucket)| *bucket))).collect();
    let index = write_atomic(
        out,
        "index.html",
        render_index(job, &GroupSignals::of(metrics).warnings(), &page).as_bytes(),
    )?;
    Ok(Report { index, plots })
}

// ---------------------------------------------------------------------------------------------
// Series

/// At most this many points per series are drawn. Beyond it the series is cut into buckets of
/// consecutive points and each bucket drawn as its mean, over a faint band from its minimum to its
/// maximum: a 100k-step job then renders in well under a second with SVGs of tens of kB per
/// series, the mean (unlike every k-th point) keeps the trend honest, and the band keeps the
/// single-step spikes (a KL blow-up) that a mean flattens. The page says when it happened.
const MAX_POINTS: usize = 2_000;

/// Series this short get a marker on each point: a line through one point (a job with one step,
/// or the held-out score at step 0 only) draws nothing.
const MARKER_MAX_POINTS: usize = 40;

/// One line of a chart: (step, value) points sorted by step, downsampled to `MAX_POINTS`.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
    /// How many input points each drawn point is the mean of (1: not downsampled).
    bucket: usize,
    /// When downsampled, the (minimum, maximum) of each point's bucket; empty otherwise.
    spread: Vec<(f64, f64)>,
}

/// A figure of a metrics line, when the line has it.
type Figure<'a> = Box<dyn Fn(&MetricsLine) -> Option<f64> + 'a>;

impl Series {
    /// The points of `figure` over `step`; lines without the figure, or with a non-finite one,
    /// are skipped. `None` when no line has it.
    fn collect(metrics: &[MetricsLine], label: &str, figure: &Figure<'_>) -> Option<Series> {
        let mut points: Vec<(f64, f64)> = metrics
            .iter()
            .filter_map(|line| Some((line.step as f64, figure(line).filter(|v| v.is_finite())?)))
            .collect();
        if points.is_empty() {
            return None;
        }
        // A resumed job may log steps again or out of order; a line must go left to right.
        // Stable, and linear on already sorted input.
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let Buckets { means, spread, size } = downsample(points, MAX_POINTS);
        Some(Series { label: label.to_owned(), points: means, bucket: size, spread })
    }
}

/// A series cut into buckets of consecutive points.
#[derive(Debug, PartialEq)]
struct Buckets {
    /// The mean step and mean value of each bucket.
    means: Vec<(f64, f64)>,
    /// The smallest and largest value of each bucket; empty when `size` is 1.
    spread: Vec<(f64, f64)>,
    /// Points per bucket (the last may hold fewer).
    size: usize,
}

/// `points` in buckets so that at most `max` remain (see `MAX_POINTS`); unchanged if they fit.
fn downsample(points: Vec<(f64, f64)>, max: usize) -> Buckets {
    if points.len() <= max || max == 0 {
        return Buckets { means: points, spread: Vec::new(), size: 1 };
    }
    let size = points.len().div_ceil(max);
    let chunks = || points.chunks(size);
    let means = chunks()
        .map(|chunk| {
            // Sum of v/n rather than (sum v)/n: finite inputs give a finite mean.
            let n = chunk.len() as f64;
            (chunk.iter().map(|p| p.0 / n).sum(), chunk.iter().map(|p| p.1 / n).sum())
        })
        .collect();
    let spread = chunks().map(|chunk| bounds(chunk.iter().map(|p| p.1))).collect();
    Buckets { means, spread, size }
}

// ---------------------------------------------------------------------------------------------
// Charts

/// The six charts of the report, in page order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chart {
    Reward,
    Heldout,
    Kl,
    CompletionLen,
    PassFail,
    StepTime,
}

/// How a chart's y axis is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum YRange {
    /// The data's range.
    Auto,
    /// From 0 (or below, if the data is) to the data's maximum.
    FromZero,
    /// At least 0 to 1: fractions and accuracies.
    Unit,
}

/// Where a chart's legend goes: where its lines usually are not.
struct Layout {
    y_range: YRange,
    legend: SeriesLabelPosition,
}

impl Chart {
    const ALL: [Chart; 6] =
        [Chart::Reward, Chart::Heldout, Chart::Kl, Chart::CompletionLen, Chart::PassFail, Chart::StepTime];

    fn file(self) -> &'static str {
        match self {
            Chart::Reward => "reward.svg",
            Chart::Heldout => "heldout.svg",
            Chart::Kl => "kl.svg",
            Chart::CompletionLen => "completion_len.svg",
            Chart::PassFail => "pass_fail.svg",
            Chart::StepTime => "step_time.svg",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Chart::Reward => "Reward mean and components",
            Chart::Heldout => "Held-out accuracy",
            Chart::Kl => "KL to the reference",
            Chart::CompletionLen => "Mean completion length",
            Chart::PassFail => "All-pass and all-fail groups",
            Chart::StepTime => "Step time",
        }
    }

    fn y_desc(self) -> &'static str {
        match self {
            Chart::Reward => "reward",
            Chart::Heldout => "accuracy",
            Chart::Kl => "KL (k3 estimate)",
            Chart::CompletionLen => "tokens",
            Chart::PassFail => "fraction of groups",
            Chart::StepTime => "seconds",
        }
    }

    /// What the page says in place of a chart with no data.
    fn missing(self) -> &'static str {
        match self {
            Chart::Reward => "no reward in this job",
            Chart::Heldout => "no held-out evaluation in this job",
            Chart::Kl => "no KL to a reference in this job",
            Chart::CompletionLen => "no completion lengths in this job",
            Chart::PassFail => "no all-pass or all-fail fractions in this job",
            Chart::StepTime => "no step timings in this job",
        }
    }

    fn layout(self) -> Layout {
        use SeriesLabelPosition::{LowerRight, UpperLeft, UpperRight};
        let (y_range, legend) = match self {
            // Reward and accuracy rise, KL grows from 0, step time is near 0 at the bottom.
            Chart::Reward => (YRange::Auto, LowerRight),
            Chart::Heldout => (YRange::Unit, LowerRight),
            Chart::Kl => (YRange::FromZero, UpperLeft),
            Chart::CompletionLen => (YRange::Auto, UpperRight),
            Chart::PassFail => (YRange::Unit, UpperRight),
            Chart::StepTime => (YRange::FromZero, UpperRight),
        };
        Layout { y_range, legend }
    }

    /// The chart's series that have at least one point; empty when the chart has no data.
    fn series(self, metrics: &[MetricsLine]) -> Vec<Series> {
        fn figure<'a>(pick: impl Fn(&MetricsLine) -> Option<f64> + 'a) -> Figure<'a> {
            Box::new(pick)
        }
        let wanted: Vec<(String, Figure<'_>)> = match self {
            Chart::Reward => {
                // One line per component any step reported: verifiers' totals and their parts.
                let components: BTreeSet<&str> = metrics
                    .iter()
                    .filter_map(|line| line.components.as_ref())
                    .flat_map(|map| map.keys().map(String::as_str))
                    .collect();
                let mut wanted = vec![("reward mean".to_owned(), figure(|line| line.reward_mean))];
                wanted.extend(components.into_iter().map(|name| {
                    let pick = move |line: &MetricsLine| line.components.as_ref()?.get(name).copied();
                    (name.to_owned(), figure(pick))
                }));
                wanted
            }
            Chart::Heldout => {
                vec![("held-out accuracy".to_owned(), figure(|line| Some(line.heldout.as_ref()?.accuracy)))]
            }
            Chart::Kl => vec![("KL to reference".to_owned(), figure(|line| line.kl_ref))],
            Chart::CompletionLen => {
                vec![("completion length mean".to_owned(), figure(|line| line.completion_len_mean))]
            }
            Chart::PassFail => vec![
                ("all pass".to_owned(), figure(|line| line.all_pass_frac)),
                ("all fail".to_owned(), figure(|line| line.all_fail_frac)),
            ],
            // Lines, not stacked areas: stacking needs every part at every step, and a line with
            // a missing part would draw a false dip. The total shows what the parts leave out.
            Chart::StepTime => vec![
                ("step (total)".to_owned(), figure(|line| Some(line.time.as_ref()?.step_s))),
                ("rollout".to_owned(), figure(|line| line.time.as_ref()?.rollout_s)),
                ("verify".to_owned(), figure(|line| line.time.as_ref()?.verify_s)),
                ("update".to_owned(), figure(|line| Some(line.time.as_ref()?.update_s))),
            ],
        };
        wanted.iter().filter_map(|(label, figure)| Series::collect(metrics, label, figure)).collect()
    }
}

const SIZE: (u32, u32) = (900, 420);

/// Tableau 10: distinct on white and for most colour-blind readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The SVG of `chart` over steps `x`; `series` is not empty.
fn draw(chart: Chart, x: Range<f64>, series: &[Series]) -> Result<String, ReportError> {
    let fail = |e: &dyn std::fmt::Display| ReportError::Plot { chart: chart.file(), message: e.to_string() };
    let layout = chart.layout();
    let values = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let extremes = series.iter().flat_map(|s| s.spread.iter().flat_map(|&(lo, hi)| [lo, hi]));
    let (lo, hi) = bounds(values.chain(extremes));
    let (lo, hi) = match layout.y_range {
        YRange::Auto => (lo, hi),
        YRange::FromZero => (lo.min(0.0), hi),
        YRange::Unit => (lo.min(0.0), hi.max(1.0)),
    };
    let y = axis_range([lo, hi].into_iter(), 0.5);
    // No more ticks than whole steps: a 2-step job would otherwise be labelled 0, 0.2, 0.4, …
    let x_labels = ((x.end - x.start).floor().max(1.0) as usize + 1).min(10);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut ctx = ChartBuilder::on(&root)
            // plotters sets text at 1/1.24 of these sizes in SVG.
            .caption(chart.title(), ("sans-serif", 24))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x, y)
            .map_err(|e| fail(&e))?;
        ctx.configure_mesh()
            .x_desc("step")
            .y_desc(chart.y_desc())
            .x_labels(x_labels)
            .x_label_formatter(&|v| fmt_step(*v))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 17))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| fail(&e))?;
        // Bands first, so that no band covers another series' line.
        for (i, s) in series.iter().enumerate().filter(|(_, s)| !s.spread.is_empty()) {
            let color = PALETTE[i % PALETTE.len()];
            let upper = s.points.iter().zip(&s.spread).map(|(p, spread)| (p.0, spread.1));
            let lower = s.points.iter().zip(&s.spread).rev().map(|(p, spread)| (p.0, spread.0));
            ctx.draw_series([Polygon::new(upper.chain(lower).collect::<Vec<_>>(), color.mix(0.25).filled())])
                .map_err(|e| fail(&e))?;
        }
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            // Each line thinner than the one under it: series that coincide (a job's only verifier
            // and the reward mean, a verifier and its one component) show as nested stripes
            // instead of the last one hiding the others.
            let above = u32::try_from(series.len() - 1 - i).unwrap_or(u32::MAX);
            let width = 1 + 2 * above.min(3);
            ctx.draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(width)))
                .map_err(|e| fail(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
            if s.points.len() <= MARKER_MAX_POINTS {
                ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(|e| fail(&e))?;
            }
        }
        ctx.configure_series_labels()
            .position(layout.legend)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
}

/// The smallest and largest of `values`; infinities the wrong way round when there are none.
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
}

/// An axis over `values` with 3% room each side; a single value gets `half` either side.
fn axis_range(values: impl Iterator<Item = f64>, half: f64) -> Range<f64> {
    let (lo, hi) = bounds(values);
    if !(lo.is_finite() && hi.is_finite()) {
        return 0.0..1.0;
    }
    // plotters' tick search never ends on an infinite span (`1e308 - -1e308`): clamp so the span
    // stays finite. Points beyond are clipped, which values this large deserve.
    let limit = f64::MAX / 4.0;
    let (lo, hi) = (lo.clamp(-limit, limit), hi.clamp(-limit, limit));
    let magnitude = lo.abs().max(hi.abs());
    // A span lost in the rounding of its magnitude is a single value too.
    if hi - lo <= magnitude * 1e-9 {
        let half = half.max(magnitude * 0.1);
        return lo - half..hi + half;
    }
    let pad = (hi - lo) * 0.03;
    lo - pad..hi + pad
}

// ---------------------------------------------------------------------------------------------
// Page

/// `index.html`: summary, gates, then each chart or the reason it is missing. `charts` holds
/// each chart with its downsampling bucket, `None` when it has no data.
fn render_index(job: &JobView, warnings: &[GroupWarning], charts: &[(Chart, Option<usize>)]) -> String {
    let mut html = String::with_capacity(8 * 1024);
    // `write!` to a String cannot fail; the results are ignored below for that reason.
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{} ({}) — rlvr job report</title>\n<style>{CSS}</style>\n</head>\n<body>\n\
         <h1>{} <span class=\"id\">{}</span></h1>\n",
        esc(&job.name),
        esc(&job.id),
        esc(&job.name),
        esc(&job.id),
    );

    let or_none = |text: &str| if text.is_empty() { NONE.to_owned() } else { text.to_owned() };
    let summary = [
        ("state", job.state.to_string()),
        ("reason", or_none(&job.reason)),
        ("team", or_none(&job.team)),
        ("model line", or_none(&job.model_line)),
        ("steps", format!("{} / {}", job.step, job.max_steps)),
        ("created", or_none(&job.created_at)),
        ("updated", or_none(&job.updated_at)),
        ("published", job.published.clone().unwrap_or_else(|| NONE.to_owned())),
        (
            "baseline",
            job.gates.as_ref().and_then(|g| g.baseline.as_ref()).map_or_else(|| NONE.to_owned(), baseline),
        ),
    ];
    html.push_str("<table class=\"summary\">\n");
    for (key, value) in summary {
        let _ = writeln!(html, "<tr><th>{key}</th><td>{}</td></tr>", esc(&value));
    }
    html.push_str("</table>\n\n<h2>Gates</h2>\n");
    match &job.gates {
        None => html.push_str("<p class=\"banner none\">no gate report for this job</p>\n"),
        Some(gates) => render_gates(&mut html, gates),
    }

    html.push_str("\n<h2>Training</h2>\n");
    // Why a job may not have learned, from the same metrics lines as the charts.
    for warning in warnings {
        let _ = writeln!(html, "<p class=\"banner warn\">warning: {}</p>", esc(&warning.message));
    }
    for (chart, drawn) in charts {
        match drawn {
            Some(bucket) => {
                let _ = write!(
                    html,
                    "<figure><img src=\"{file}\" alt=\"{title}\" width=\"{w}\" height=\"{h}\">",
                    file = chart.file(),
                    title = chart.title(),
                    w = SIZE.0,
                    h = SIZE.1,
                );
                if *bucket > 1 {
                    let _ = write!(
                        html,
                        "<figcaption>downsampled: each point is the mean of up to {bucket} consecutive \
                         steps, the band spans their minimum to maximum</figcaption>"
                    );
                }
                html.push_str("</figure>\n");
            }
            None => {
                let _ = writeln!(html, "<p class=\"nodata\">{}: {}</p>", chart.title(), chart.missing());
            }
        }
    }
    html.push_str("</body>\n</html>\n");
    html
}

/// The verdict banner and one row per criterion: its result is its [`Status`], in the words
/// `rlvrctl gates` uses ([`Status::label`]), coloured by [`status_class`].
fn render_gates(html: &mut String, gates: &GateReport) {
    let (class, verdict) = if gates.passed { ("pass", "gates passed") } else { ("fail", "gates failed") };
    // A forced promotion colours the banner whatever the verdict: someone overrode the gates.
    let class = if gates.forced.is_some() { "forced" } else { class };
    let _ = write!(html, "<p class=\"banner {class}\">{verdict}");
    if let Some(forced) = &gates.forced {
        let _ = write!(
            html,
            "; promoted by force by {} at {}: {}",
            esc(&forced.by),
            esc(&forced.at),
            esc(&forced.reason),
        );
    }
    html.push_str("</p>\n");

    if gates.criteria.is_empty() {
        html.push_str("<p class=\"nodata\">no criteria in the gate report</p>\n");
        return;
    }
    if let Some(candidate) = &gates.candidate {
        let _ = writeln!(html, "<p>candidate: {}</p>", esc(&candidate.describe()));
    }
    html.push_str(
        "<table class=\"gates\">\n<tr><th>criterion</th><th>result</th><th>measured</th>\
         <th>threshold</th><th>interval</th><th>note</th></tr>\n",
    );
    for criterion in &gates.criteria {
        let threshold = criterion
            .threshold
            .map_or_else(|| NONE.to_owned(), |t| format!("{} {}", criterion.op.as_str(), fmt_num(t)));
        let _ = writeln!(
            html,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            status_class(criterion.status),
            esc(&criterion.name),
            esc(criterion.status.label()),
            criterion.measured.map_or_else(|| NONE.to_owned(), fmt_num),
            esc(&threshold),
            criterion.interval.as_ref().map_or_else(|| NONE.to_owned(), |interval| esc(&interval.bounds())),
            esc(&criterion.note),
        );
    }
    html.push_str("</table>\n");
}

/// The CSS class of a criterion's row.
fn status_class(status: Status) -> &'static str {
    match status {
        Status::Pass => "pass",
        Status::Fail => "fail",
        Status::NotChecked => "unchecked",
    }
}

/// `published v3: MODEL` or `start: MODEL`.
fn baseline(baseline: &Baseline) -> String {
    let kind = match baseline.kind {
        BaselineKind::Published => "published",
        BaselineKind::Start => "start",
    };
    match baseline.version {
        Some(version) => format!("{kind} v{version}: {}", baseline.model),
        None => format!("{kind}: {}", baseline.model),
    }
}

/// What the page shows for a missing value.
const NONE: &str = "—";

/// A tick of the step axis: whole steps as integers ("1500", not "1500.0").
fn fmt_step(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        // `+ 0.0` turns -0 into 0.
        format!("{:.0}", v.round() + 0.0)
    } else {
        fmt_num(v)
    }
}

/// A measured value or threshold: four decimals at most, no trailing zeros, scientific notation
/// for magnitudes four decimals would lose.
fn fmt_num(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e9) {
        return format!("{v:.3e}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".to_owned() } else { s.to_owned() }
}

/// `s` safe as HTML text and inside a quoted attribute.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:960px;\
color:#222;padding:0 1em}\
h1 .id{font-size:60%;color:#777;font-weight:normal}\
table{border-collapse:collapse;margin:1em 0}\
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}\
table.summary th{background:#f4f4f4}\
table.gates tr:first-child th{background:#f4f4f4}\
tr.pass td:nth-child(2){color:#1a7f37;font-weight:bold}\
tr.fail td:nth-child(2){color:#cf222e;font-weight:bold}\
tr.unchecked td:nth-child(2){color:#777}\
.banner{padding:.6em 1em;border-radius:4px;font-weight:bold}\
.banner.pass{background:#dafbe1;color:#1a7f37}\
.banner.fail{background:#ffebe9;color:#cf222e}\
.banner.warn{background:#fff8c5;color:#7d4e00;font-weight:normal}\
.banner.forced{background:#fff8c5;color:#7d4e00}\
.banner.none{background:#f4f4f4;color:#555}\
figure{margin:1.5em 0}\
figure img{max-width:100%;height:auto;border:1px solid #eee}\
figcaption{color:#777;font-size:90%}\
.nodata{color:#777;font-style:italic}";

// ---------------------------------------------------------------------------------------------
// Files

/// Writes `contents` to `dir/name` atomically (`rlvr_protocol::fs::write_atomic`: a reader sees
/// the old file or the new one, never half).
fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> Result<PathBuf, ReportError> {
    let path = dir.join(name);
    rlvr_protocol::fs::write_atomic(&path, contents)
        .map_err(|source| ReportError::Write { path: path.clone(), source })?;
    Ok(path)
}

/// Removes `path` if it exists.
fn remove_stale(path: &Path) -> Result<(), ReportError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(ReportError::Remove { path: path.to_owned(), source: e })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use rlvr_protocol::checkpoints::ScoredCheckpoint;
    use rlvr_protocol::gates::{Criterion, Forced, Op, PairedInterval};
    use rlvr_protocol::job::JobState;
    use rlvr_protocol::worker::{CandidateCheckpoint, ScoreFigures, StepTimes};
    use serde_json::json;

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Lines 1–3 and 296 of a real 296-line metrics file (tiny-arith, 295 steps): the held-out
    /// score before training, two steps, the last step. That job had no reference model, so
    /// `kl_ref` is null throughout and held-out was scored at step 0 only.
    const SAMPLE: &str = r#"{"heldout":{"accuracy":0.31,"completion_len_mean":2.985,"prompts":200,"reward_mean":0.31},"step":0}
{"all_fail_frac":0.359375,"all_pass_frac":0.0,"completion_len_max":3.0,"completion_len_mean":2.990234375,"components":{"math":0.173828125,"math.correct":0.173828125,"math.extracted":1.0},"cut_frac":0.0,"entropy":0.6598574682042784,"grad_norm":0.7755231261253357,"kl_ref":null,"loss":-6.51925802230835e-9,"lr":0.0005,"opt.clip_frac_high":0.0,"opt.clip_frac_low":0.0,"opt.ratio_mean":1.000000016117781,"opt.uniform_group_frac":0.359375,"passed_frac":0.173828125,"reward_mean":0.173828125,"reward_std":0.3789616180551592,"step":1,"time":{"generation_tokens_per_s":29559.963167243284,"rollout_s":0.051793028,"step_s":0.235643601,"update_s":0.166062318,"verifier_latency_us":{"p50":13,"p99":79},"verify_s":0.01127861},"tokens_generated":1531,"verifier_errors":0,"verifier_timeouts":0}
{"all_fail_frac":0.34375,"all_pass_frac":0.0,"completion_len_max":3.0,"completion_len_mean":2.953125,"components":{"math":0.197265625,"math.correct":0.197265625,"math.extracted":0.998046875},"cut_frac":0.0,"entropy":0.6283339849528596,"grad_norm":0.8105406165122986,"kl_ref":null,"loss":1.862645149230957e-9,"lr":0.0004999922894111975,"opt.clip_frac_high":0.0,"opt.clip_frac_low":0.0,"opt.ratio_mean":1.0000000068198436,"opt.uniform_group_frac":0.34375,"passed_frac":0.197265625,"reward_mean":0.197265625,"reward_std":0.39793454008587814,"step":2,"time":{"generation_tokens_per_s":32066.98980804174,"rollout_s":0.047151292,"step_s":0.196164665,"update_s":0.128093429,"verifier_latency_us":{"p50":19,"p99":73},"verify_s":0.012536352},"tokens_generated":1512,"verifier_errors":0,"verifier_timeouts":0}
{"all_fail_frac":0.3125,"all_pass_frac":0.4375,"completion_len_max":3.0,"completion_len_mean":2.978515625,"components":{"math":0.615234375,"math.correct":0.615234375,"math.extracted":1.0},"cut_frac":0.0,"entropy":0.11189231621413769,"grad_norm":4.536289215087891,"kl_ref":null,"loss":6.51925802230835e-9,"lr":0.00008174687162255672,"opt.clip_frac_high":0.0,"opt.clip_frac_low":0.0,"opt.ratio_mean":0.9999999761190571,"opt.uniform_group_frac":0.75,"passed_frac":0.615234375,"reward_mean":0.615234375,"reward_std":0.48653986354497136,"step":295,"time":{"generation_tokens_per_s":9483.404682324413,"rollout_s":0.160807226,"step_s":0.74510758,"update_s":0.548394744,"verifier_latency_us":{"p50":13,"p99":33},"verify_s":0.015923181},"tokens_generated":1525,"verifier_errors":0,"verifier_timeouts":0}"#;

    /// What a job with a reference model and periodic held-out adds to `SAMPLE`.
    const WITH_KL: &str = r#"{"step":1,"kl_ref":0.0}
{"step":2,"kl_ref":0.004}
{"step":295,"kl_ref":0.031}
{"step":295,"heldout":{"accuracy":0.43,"completion_len_mean":3.0,"prompts":200,"reward_mean":0.43}}"#;

    /// An SFT job's lines: a loss, nothing the six charts plot.
    const SFT: &str = r#"{"step":1,"loss":2.31}
{"step":2,"loss":1.97,"lr":0.0001}"#;

    const ALL: [&str; 6] =
        ["reward.svg", "heldout.svg", "kl.svg", "completion_len.svg", "pass_fail.svg", "step_time.svg"];

    /// Metrics lines as the worker writes them.
    fn lines(jsonl: &str) -> Vec<MetricsLine> {
        jsonl.lines().map(|l| serde_json::from_str(l).expect("test line is a metrics line")).collect()
    }

    /// One metrics line from its JSON.
    fn line(json: serde_json::Value) -> MetricsLine {
        serde_json::from_value(json).expect("a metrics line")
    }

    /// A gate report with a criterion of each status, judged the daemon's way.
    fn gate_report() -> GateReport {
        let criteria = vec![
            Criterion::judged(
                "heldout_gain",
                Op::AtLeast,
                Some(0.0625),
                Some(0.01),
                "held-out accuracy 0.31 → 0.43".to_owned(),
            )
            .with_interval(PairedInterval {
                estimate: 0.125,
                low: 0.0625,
                high: 0.1875,
                confidence: 0.95,
                prompts: 48,
                improved: 7,
                regressed: 1,
            }),
            Criterion::judged(
                "canary_regressions",
                Op::AtMost,
                Some(2.0),
                Some(0.0),
                "2 canaries regressed".to_owned(),
            ),
            Criterion::judged(
                "reward_trend",
                Op::AtLeast,
                None,
                None,
                "no trend: fewer than 20 steps".to_owned(),
            ),
            Criterion::judged("kl_budget", Op::AtMost, Some(0.031), None, "no KL budget set".to_owned()),
        ];
        let baseline = Baseline {
            kind: BaselineKind::Published,
            model: "/srv/registry/tiny/v3".to_owned(),
            version: Some(3),
        };
        // The verdict as stored, whatever the criteria say: the page shows what it is given.
        GateReport {
            passed: true,
            candidate: Some(CandidateCheckpoint {
                step: 20,
                heldout: Some(0.4375),
                scored: vec![
                    ScoredCheckpoint { step: 20, accuracy: 0.4375 },
                    ScoredCheckpoint { step: 30, accuracy: 0.375 },
                ],
            }),
            ..GateReport::new(Some(baseline), criteria)
        }
    }

    fn job() -> JobView {
        JobView {
            id: "01J8ZK3Q".to_owned(),
            team: "math".to_owned(),
            name: "arith-grpo".to_owned(),
            model_line: "tiny".to_owned(),
            kind: Some(rlvr_protocol::kind::JobKind::OnlineGroups),
            priority: rlvr_protocol::spec::Priority::Normal,
            state: JobState::Published,
            step: 295,
            max_steps: 300,
            reason: String::new(),
            created_at: "2025-05-01T10:00:00Z".to_owned(),
            updated_at: "2025-05-01T10:04:12Z".to_owned(),
            crashes: 0,
            cancel_requested: false,
            devices: Vec::new(),
            preemptions: 0,
            grant: None,
            progress: None,
            heldout: Some(0.43),
            result: None,
            gates: Some(gate_report()),
            published: Some("/srv/registry/tiny/v4".to_owned()),
            published_version: None,
            published_dataset: None,
            output: None,
            webhook: None,
            curriculum_version: None,
            memory_gb: 0.0,
            resident_gb: None,
        }
    }

    /// Renders into a fresh directory; returns it (keep it alive), the report and the page.
    fn render(job: &JobView, metrics: &[MetricsLine]) -> (tempfile::TempDir, Report, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = write(&dir.path().join("report"), job, metrics).expect("report renders");
        let html = fs::read_to_string(&report.index).expect("index.html");
        (dir, report, html)
    }

    /// The names of the files in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Renders `metrics` and checks that exactly `plots` were drawn, each named by the page, and
    /// that the page says why each other chart is missing.
    fn check(metrics: &[MetricsLine], plots: &[&str]) {
        let (_dir, report, html) = render(&job(), metrics);
        let written: Vec<&str> =
            report.plots.iter().map(|p| p.file_name().and_then(|n| n.to_str()).expect("name")).collect();
        assert_eq!(written, plots);
        for chart in Chart::ALL {
            let drawn = plots.contains(&chart.file());
            let img = format!("<img src=\"{}\"", chart.file());
            assert_eq!(html.contains(&img), drawn, "{}: {html}", chart.file());
            assert_eq!(html.contains(chart.missing()), !drawn, "{}: {html}", chart.file());
            if drawn {
                let svg = fs::read_to_string(report.index.with_file_name(chart.file())).expect("plot");
                assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
                // Axis labels and the legend of every chart.
                for text in ["step", chart.y_desc(), chart.title()] {
                    assert!(svg.contains(text), "{} lacks {text:?}", chart.file());
                }
            }
        }
        let mut files: Vec<&str> = plots.to_vec();
        files.push("index.html");
        files.sort();
        assert_eq!(listing(report.index.parent().expect("dir")), files, "exactly the report, no temp files");
    }

    #[test]
    fn draws_each_chart_with_data_and_says_which_have_none() {
        let mut full = lines(SAMPLE);
        full.extend(lines(WITH_KL));
        let mut sample_and_sft = lines(SAMPLE);
        sample_and_sft.extend(lines(SFT));
        let cases: Vec<(&str, Vec<MetricsLine>, Vec<&str>)> = vec![
            ("sample with KL and later held-out", full, ALL.to_vec()),
            (
                "sample as logged: no reference model",
                lines(SAMPLE),
                vec!["reward.svg", "heldout.svg", "completion_len.svg", "pass_fail.svg", "step_time.svg"],
            ),
            ("SFT job: loss only", lines(SFT), vec![]),
            ("SFT lines do not disturb RL ones", sample_and_sft, check_five()),
            ("no metrics yet", vec![], vec![]),
            (
                "held-out before training only",
                lines(&SAMPLE[..SAMPLE.find('\n').expect("line")]),
                vec!["heldout.svg"],
            ),
            (
                "one step: a line through one point",
                vec![line(json!({"step": 1, "reward_mean": 0.5, "kl_ref": 0.0, "all_pass_frac": 0.0}))],
                vec!["reward.svg", "kl.svg", "pass_fail.svg"],
            ),
            (
                "lines with a step and none of the charted figures",
                vec![
                    line(json!({"step": 3})),
                    line(json!({"step": 4, "components": {}, "opt.ratio_mean": 1.0, "lr": 0.1})),
                    line(json!({"step": 5, "kl_ref": null, "loss": 0.2})),
                ],
                vec![],
            ),
            (
                "values at the edge of f64, non-finite ones, and repeated steps out of order",
                vec![
                    line(
                        json!({"step": 1_000_000_000_000_000u64, "reward_mean": -1.7e308, "kl_ref": 1e-300}),
                    ),
                    line(json!({"step": 0, "reward_mean": 1.7e308, "kl_ref": 1e-300})),
                    line(
                        json!({"step": 1_000_000_000_000_000u64, "reward_mean": 0.0, "completion_len_mean": 1e300}),
                    ),
                    line(json!({"step": 2, "completion_len_mean": 1e300})),
                    MetricsLine { step: 7, all_pass_frac: Some(f64::NAN), ..MetricsLine::default() },
                    MetricsLine { step: 8, all_fail_frac: Some(f64::INFINITY), ..MetricsLine::default() },
                ],
                vec!["reward.svg", "kl.svg", "completion_len.svg"],
            ),
        ];
        for (name, metrics, plots) in cases {
            eprintln!("case: {name}");
            check(&metrics, &plots);
        }
    }

    fn check_five() -> Vec<&'static str> {
        vec!["reward.svg", "heldout.svg", "completion_len.svg", "pass_fail.svg", "step_time.svg"]
    }

    #[test]
    fn reward_chart_has_a_line_per_component() {
        let (_dir, report, _) = render(&job(), &lines(SAMPLE));
        let svg = fs::read_to_string(&report.plots[0]).expect("reward.svg");
        // plotters writes each text on a line of its own.
        for label in ["\nreward mean\n", "\nmath\n", "\nmath.correct\n", "\nmath.extracted\n"] {
            assert!(svg.contains(label), "legend lacks {label}");
        }
        // Held-out at step 0 is one point: drawn as a marker.
        let svg = fs::read_to_string(&report.plots[1]).expect("heldout.svg");
        assert!(svg.contains("<circle"), "{svg}");
    }

    #[test]
    fn page_has_summary_and_gate_table() {
        fn gates(job: &mut JobView) -> &mut GateReport {
            job.gates.as_mut().expect("a gate report")
        }
        let mut failed = job();
        gates(&mut failed).passed = false;
        gates(&mut failed).forced = Some(Forced {
            by: "math".to_owned(),
            reason: "canaries are flaky, see #412".to_owned(),
            at: "2025-05-02T09:00:00Z".to_owned(),
        });
        let mut start = job();
        gates(&mut start).baseline = Some(Baseline {
            kind: BaselineKind::Start,
            model: "builtin:tiny-arith".to_owned(),
            version: None,
        });
        gates(&mut start).passed = false;
        let mut no_gates = job();
        no_gates.gates = None;
        let mut no_criteria = job();
        gates(&mut no_criteria).criteria.clear();

        // Each result in `rlvrctl gates`'s words: a measured value without a threshold is not
        // checked, not passed.
        let rows = [
            "<tr class=\"pass\"><td>heldout_gain</td><td>pass</td><td>0.0625</td><td>&gt;= 0.01</td>\
             <td>[+0.0625, +0.1875] 95%, 48 prompts</td><td>held-out accuracy 0.31 → 0.43</td></tr>",
            "<tr class=\"fail\"><td>canary_regressions</td><td>FAIL</td><td>2</td><td>&lt;= 0</td>\
             <td>—</td><td>2 canaries regressed</td></tr>",
            "<tr class=\"unchecked\"><td>reward_trend</td><td>not checked</td><td>—</td><td>—</td>\
             <td>—</td><td>no trend: fewer than 20 steps</td></tr>",
            "<tr class=\"unchecked\"><td>kl_budget</td><td>not checked</td><td>0.031</td><td>—</td>\
             <td>—</td><td>no KL budget set</td></tr>",
        ];
        let summary = [
            "<title>arith-grpo (01J8ZK3Q) — rlvr job report</title>",
            "<tr><th>state</th><td>published</td></tr>",
            "<tr><th>reason</th><td>—</td></tr>",
            "<tr><th>model line</th><td>tiny</td></tr>",
            "<tr><th>steps</th><td>295 / 300</td></tr>",
            "<tr><th>published</th><td>/srv/registry/tiny/v4</td></tr>",
        ];
        let cases: Vec<(&str, JobView, Vec<&str>)> = vec![
            (
                "passed",
                job(),
                [&summary[..], &rows[..]]
                    .concat()
                    .into_iter()
                    .chain([
                        "<p class=\"banner pass\">gates passed</p>",
                        "<tr><th>baseline</th><td>published v3: /srv/registry/tiny/v3</td></tr>",
                    ])
                    .collect(),
            ),
            (
                "failed, promoted by force",
                failed,
                vec![
                    "<p class=\"banner forced\">gates failed; promoted by force by math at \
                     2025-05-02T09:00:00Z: canaries are flaky, see #412</p>",
                    rows[1],
                ],
            ),
            (
                "failed against the starting model",
                start,
                vec![
                    "<p class=\"banner fail\">gates failed</p>",
                    "<tr><th>baseline</th><td>start: builtin:tiny-arith</td></tr>",
                ],
            ),
            (
                "no gate report",
                no_gates,
                vec!["<p class=\"banner none\">no gate report for this job</p>", "<td>—</td></tr>"],
            ),
            ("no criteria", no_criteria, vec!["no criteria in the gate report"]),
        ];
        for (name, job, expected) in cases {
            let (_dir, _, html) = render(&job, &lines(SAMPLE));
            for text in expected {
                assert!(html.contains(text), "{name}: page lacks {text:?}:\n{html}");
            }
        }
    }

    /// The RESULT of each criterion in `rlvrctl gates`'s table, by name.
    fn table_results(table: &str) -> Vec<(String, String)> {
        let mut lines = table.lines().skip_while(|line| !line.starts_with("CRITERION"));
        let header = lines.next().expect("the table's header");
        let (result, measured) =
            (header.find("RESULT").expect("RESULT"), header.find("MEASURED").expect("MEASURED"));
        lines
            .take_while(|line| !line.starts_with("forced by"))
            .map(|line| {
                let name = line.split_whitespace().next().expect("a name").to_owned();
                (name, line[result..measured].trim().to_owned())
            })
            .collect()
    }

    /// The result cell of each criterion in the page's gate table, by name, with its row's class.
    fn page_results(html: &str) -> Vec<(String, String, String)> {
        html.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix("<tr class=\"")?;
                let (class, rest) = rest.split_once("\"><td>")?;
                let (name, rest) = rest.split_once("</td><td>")?;
                let (result, _) = rest.split_once("</td>")?;
                Some((name.to_owned(), result.to_owned(), class.to_owned()))
            })
            .collect()
    }

    #[test]
    fn rlvrctl_gates_and_the_report_say_the_same_result_for_every_criterion() {
        // regression: `rlvrctl gates` said "pass" where the report said "not checked" for a
        // criterion measured without a threshold.
        let report = gate_report();
        let statuses: Vec<Status> = report.criteria.iter().map(|c| c.status).collect();
        assert_eq!(statuses, [Status::Pass, Status::Fail, Status::NotChecked, Status::NotChecked]);
        let table = table_results(&crate::render::gate_table("01J8ZK3Q", &report));
        let (_dir, _, html) = render(&job(), &[]);
        let page = page_results(&html);
        assert_eq!(table.len(), report.criteria.len(), "{table:?}");
        assert_eq!(page.len(), report.criteria.len(), "{html}");
        for ((criterion, (name, shown)), (page_name, result, class)) in
            report.criteria.iter().zip(&table).zip(&page)
        {
            assert_eq!((name, page_name), (&criterion.name, &criterion.name));
            assert_eq!(shown, criterion.status.label(), "rlvrctl gates, {name}");
            assert_eq!(result, shown, "the report and rlvrctl gates, {name}");
            assert_eq!(class, status_class(criterion.status), "{name}");
        }
        let words: Vec<&str> = table.iter().map(|(_, result)| result.as_str()).collect();
        assert_eq!(words, ["pass", "FAIL", "not checked", "not checked"]);
        // Both show the held-out gain's interval with its prompts, and the checkpoint judged.
        let text = crate::render::gate_table("01J8ZK3Q", &report);
        let interval = "[+0.0625, +0.1875] 95%, 48 prompts";
        let candidate = "candidate: checkpoint step 20 (held-out 0.4375 when scored; the best of 2 scored checkpoints kept)";
        for shown in [&text, &html] {
            assert!(shown.contains(interval) && shown.contains(candidate), "{shown}");
        }
    }

    #[test]
    fn user_text_is_escaped() {
        let attack = "<script>alert('x')</script>\"&";
        let escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;";
        let mut job = job();
        job.name = attack.to_owned();
        job.id = attack.to_owned();
        job.reason = attack.to_owned();
        job.published = Some(attack.to_owned());
        let gates = job.gates.as_mut().expect("a gate report");
        gates.criteria[0].name = attack.to_owned();
        gates.criteria[0].note = attack.to_owned();
        gates.baseline.as_mut().expect("a baseline").model = attack.to_owned();
        gates.forced =
            Some(Forced { by: attack.to_owned(), reason: attack.to_owned(), at: attack.to_owned() });
        let metrics = vec![line(json!({"step": 1, "reward_mean": 0.5, "components": {attack: 0.5}}))];
        let (_dir, report, html) = render(&job, &metrics);
        assert!(!html.contains("<script"), "{html}");
        assert!(html.matches(escaped).count() >= 10, "{html}");
        // Component names come from plugins: plotters escapes SVG text.
        let svg = fs::read_to_string(&report.plots[0]).expect("reward.svg");
        assert!(!svg.contains("<script") && svg.contains("&lt;script&gt;"), "{svg}");
    }

    #[test]
    fn large_job_is_downsampled_and_stays_small() {
        let steps: u32 = 100_000;
        let metrics: Vec<MetricsLine> = (1..=steps)
            .map(|step| {
                let t = f64::from(step) / f64::from(steps);
                let components = [("math", t), ("math.correct", t), ("format", 1.0 - t)]
                    .map(|(name, v)| (name.to_owned(), v));
                MetricsLine {
                    step: u64::from(step),
                    reward_mean: Some(t + (f64::from(step) * 0.7).sin() * 0.1),
                    components: Some(components.into()),
                    kl_ref: Some(t * 0.05),
                    completion_len_mean: Some(100.0 + f64::from(step % 37)),
                    all_pass_frac: Some(t),
                    all_fail_frac: Some(1.0 - t),
                    time: Some(StepTimes {
                        rollout_s: Some(1.0),
                        verify_s: Some(0.1),
                        update_s: 0.5,
                        sync_s: None,
                        step_s: 1.7,
                        ..StepTimes::default()
                    }),
                    heldout: (step % 1000 == 0).then_some(ScoreFigures {
                        accuracy: t,
                        reward_mean: t,
                        completion_len_mean: 3.0,
                        prompts: 200,
                    }),
                    ..MetricsLine::default()
                }
            })
            .collect();
        let started = std::time::Instant::now();
        let (_dir, report, html) = render(&job(), &metrics);
        eprintln!("100k steps rendered in {:?}", started.elapsed());
        assert_eq!(report.plots.len(), 6);
        for plot in &report.plots {
            let size = fs::metadata(plot).expect("plot").len();
            eprintln!("{}: {size} bytes", plot.display());
            assert!(size < 1_000_000, "{} is {size} bytes", plot.display());
        }
        // Five charts were bucketed by 50 steps; held-out (100 points) was not.
        assert_eq!(html.matches("mean of up to 50 consecutive steps").count(), 5, "{html}");
    }

    #[test]
    fn creates_the_directory_and_replaces_an_earlier_report() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("a/b/report");
        let mut full = lines(SAMPLE);
        full.extend(lines(WITH_KL));
        let first = write(&out, &job(), &full).expect("first render");
        assert_eq!(first.index, out.join("index.html"));
        assert_eq!(first.plots.len(), 6);
        let mode = fs::metadata(&first.index).expect("index").permissions().mode();
        assert_ne!(mode & 0o044, 0, "readable beyond the owner (umask allowing): {mode:o}");

        // Rendered again with less data: the plot whose chart now has none does not linger.
        let second = write(&out, &job(), &lines(SAMPLE)).expect("second render");
        assert_eq!(second.plots.len(), 5);
        assert!(!out.join("kl.svg").exists());
        let mut expected: Vec<String> = check_five().into_iter().map(str::to_owned).collect();
        expected.push("index.html".to_owned());
        expected.sort();
        assert_eq!(listing(&out), expected);
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        fs::write(&file, "").expect("file");
        let out = file.join("report");
        let err = write(&out, &job(), &lines(SAMPLE)).expect_err("a file is in the way");
        assert!(matches!(&err, ReportError::CreateDir { path, .. } if *path == out), "{err:?}");
        assert_eq!(err.to_string(), format!("cannot create report directory {}", out.display()));

        // A directory where a plot goes cannot be replaced by it.
        let out = dir.path().join("report");
        fs::create_dir_all(out.join("kl.svg").join("x")).expect("dir");
        let mut full = lines(SAMPLE);
        full.extend(lines(WITH_KL));
        let err = write(&out, &job(), &full).expect_err("kl.svg is a directory");
        assert!(matches!(&err, ReportError::Write { path, .. } if *path == out.join("kl.svg")), "{err:?}");
        let mut names = listing(&out);
        names.retain(|n| n.contains(".tmp"));
        assert_eq!(names, Vec::<String>::new(), "no temp file left after a failed write");
    }

    #[test]
    fn downsample_keeps_bucket_means() {
        let cases: [(usize, usize, usize, usize); 6] = [
            // (points, max, drawn, bucket)
            (0, 2_000, 0, 1),
            (2_000, 2_000, 2_000, 1),
            (2_001, 2_000, 1_001, 2),
            (100_000, 2_000, 2_000, 50),
            (100_001, 2_000, 1_961, 51),
            (10, 3, 3, 4),
        ];
        for (n, max, drawn, bucket) in cases {
            let points: Vec<(f64, f64)> = (0..n).map(|i| (i as f64, 2.0 * i as f64)).collect();
            let out = downsample(points, max);
            assert_eq!((out.means.len(), out.size), (drawn, bucket), "{n} points, max {max}");
            let spread = if bucket == 1 { 0 } else { drawn };
            assert_eq!(out.spread.len(), spread, "{n} points, max {max}");
        }
        let out = downsample(vec![(1.0, 1.0), (2.0, 3.0), (3.0, 1.7e308), (4.0, 1.7e308), (5.0, -1.0)], 2);
        assert_eq!(
            out,
            Buckets {
                means: vec![(2.0, 1.7e308 / 3.0 + 4.0 / 3.0), (4.5, 1.7e308 / 2.0 - 0.5)],
                spread: vec![(1.0, 1.7e308), (-1.0, 1.7e308)],
                size: 3,
            }
        );
    }

    #[test]
    fn axis_ranges_are_finite_and_not_empty() {
        let cases: [(&[f64], Range<f64>); 6] = [
            (&[0.0, 10.0], -0.3..10.3),
            (&[3.0], 2.5..3.5),
            (&[1e12], 0.9e12..1.1e12),
            (&[], 0.0..1.0),
            (&[-1.7e308, 1.7e308], (f64::MIN / 4.0) * 1.06..(f64::MAX / 4.0) * 1.06),
            (&[1.7e308], (f64::MAX / 4.0) * 0.9..(f64::MAX / 4.0) * 1.1),
        ];
        for (values, expected) in cases {
            let range = axis_range(values.iter().copied(), 0.5);
            let close = |a: f64, b: f64| (a - b).abs() <= b.abs() * 1e-12;
            assert!(
                close(range.start, expected.start) && close(range.end, expected.end),
                "{values:?}: {range:?}"
            );
            assert!((range.end - range.start).is_finite());
        }
    }

    #[test]
    fn numbers() {
        let nums = [
            (0.12, "0.12"),
            (0.12000000000000001, "0.12"),
            (0.0, "0"),
            (-0.00001, "-1.000e-5"),
            (-0.00004, "-4.000e-5"),
            (2.0, "2"),
            (1.23456, "1.2346"),
            (3e9, "3.000e9"),
        ];
        for (v, s) in nums {
            assert_eq!(fmt_num(v), s, "{v}");
        }
    }

    /// A job whose groups were all-fail says so above its charts; one with signal does not.
    #[test]
    fn a_job_without_signal_is_warned_of_in_the_report() {
        let all_fail = lines(
            r#"{"step":1,"reward_mean":0.0,"all_fail_frac":1.0,"all_pass_frac":0.0}
{"step":2,"reward_mean":0.0,"all_fail_frac":1.0,"all_pass_frac":0.0}"#,
        );
        let (_dir, _, html) = render(&job(), &all_fail);
        assert!(
            html.contains("<p class=\"banner warn\">warning: every group was all-fail in 2 of 2 steps: "),
            "{html}"
        );
        let mixed = lines(r#"{"step":1,"reward_mean":0.5,"all_fail_frac":0.25,"all_pass_frac":0.25}"#);
        let (_dir, _, html) = render(&job(), &mixed);
        assert!(!html.contains("banner warn"), "{html}");
    }
}
