//! The chart of the `stores` bench: the library's cost per operation ÷ the hand-written code's,
//! per store, path and number of callers, as a self-contained SVG, and the full tables in markdown on stdout.
//!
//! `cargo run -p idem-benches --bin chart [OUT.svg] [IN.jsonl]`
//!
//! - `OUT.svg` defaults to `docs/benchmarks.svg` in the workspace;
//! - `IN.jsonl` defaults to `target/idem-bench/stores.jsonl` (`$CARGO_TARGET_DIR/idem-bench/`
//!   when that is set), written by `bash scripts/bench`.
//!
//! One panel per store that has a baseline (`memory` has none and is only in the tables): for
//! each path, one bar per number of callers, its height the library cell's
//! `ratio_to_baseline` (the median over rounds of raw ops/s ÷ library ops/s: the library's time
//! per operation ÷ the hand-written code's), at the stored body size of 100 B where a path was
//! measured at several sizes (else the smallest). A solid line marks 1.00 (as fast as the
//! hand-written code), a dashed one the 1.10 target (at most 10% slower); lower is better.

use idem_benches::report::{self, Cell};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::UNIX_EPOCH;

/// The side whose cells carry the ratio.
const LIBRARY: &str = "library";
/// The hand-written baseline the ratio is taken against.
const RAW: &str = "raw";
/// The hand-written code without its hop (SQLite only): a floor, shown in the tables.
const RAW_INLINE: &str = "raw_inline";
/// The hand-written code for the fewest hops and round trips, not the store's statements:
/// shown in the tables with the library's ratio to it.
const FLOOR: &str = idem_benches::harness::FLOOR;
/// The size shown in the chart when a path was measured at several.
const PREFERRED_SIZE: usize = 100;
/// The dashed line.
const TARGET: f64 = 1.10;
/// The highest value on a panel's axis: larger ratios are drawn clipped, their value written.
const Y_CAP: f64 = 2.5;
/// Stores drawn first, in this order; any other store with ratios follows.
const STORE_ORDER: [&str; 3] = ["sqlite", "postgres", "redis"];
/// Bar colours by number of callers, in increasing order of callers.
const PALETTE: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
];

// Layout, in SVG user units (pixels).
const WIDTH: f64 = 960.0;
const MARGIN_LEFT: f64 = 78.0;
const MARGIN_RIGHT: f64 = 96.0;
const HEADER: f64 = 92.0;
const PANEL_HEIGHT: f64 = 270.0;
const PANEL_GAP: f64 = 40.0;
const FOOTER: f64 = 36.0;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let out = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/benchmarks.svg")
    });
    let input = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| report::dir().join("stores.jsonl"));
    match run(&out, &input) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("chart: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(out: &Path, input: &Path) -> Result<(), String> {
    let text = match std::fs::read_to_string(input) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "no results at {}: run `bash scripts/bench` first (the `stores` bench writes them)",
                input.display()
            ))
        }
        Err(e) => return Err(format!("cannot read {}: {e}", input.display())),
    };
    let cells = parse(&text).map_err(|e| format!("{}: {e}", input.display()))?;
    if cells.is_empty() {
        return Err(format!(
            "{} has no results: run `bash scripts/bench` first",
            input.display()
        ));
    }
    let date = std::fs::metadata(input)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| utc_date(d.as_secs()));
    let title = match &date {
        Some(date) => format!("idem stores against hand-written code, {date}"),
        None => "idem stores against hand-written code".to_owned(),
    };
    let svg = svg(&cells, &title);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::write(out, svg).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    eprintln!("chart: wrote {} from {}", out.display(), input.display());
    print!("{}", markdown(&cells));
    Ok(())
}

/// Reads JSON lines of [`Cell`]s, blank lines skipped.
fn parse(text: &str) -> Result<Vec<Cell>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

/// `YYYY-MM-DD` (UTC) of a Unix time in seconds (H. Hinnant's civil-from-days).
fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} UTC")
}

/// Values in their order of first appearance.
fn ordered<'a, T: PartialEq + 'a>(items: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// The stores that get a panel: the known ones first, then the others with ratios in order
/// of appearance.
fn charted_stores(cells: &[Cell]) -> Vec<&str> {
    let with_ratio = ordered(
        cells
            .iter()
            .filter(|c| c.side == LIBRARY && c.ratio_to_baseline.is_some())
            .map(|c| c.store.as_str()),
    );
    let mut stores: Vec<&str> = STORE_ORDER
        .iter()
        .copied()
        .filter(|s| with_ratio.contains(s))
        .collect();
    stores.extend(with_ratio.iter().filter(|s| !STORE_ORDER.contains(s)));
    stores
}

/// The stores of the tables: the known ones first, then the others (`memory`) in order of
/// appearance.
fn table_stores(cells: &[Cell]) -> Vec<&str> {
    let all = ordered(cells.iter().map(|c| c.store.as_str()));
    let mut stores: Vec<&str> = STORE_ORDER
        .iter()
        .copied()
        .filter(|s| all.contains(s))
        .collect();
    stores.extend(all.iter().filter(|s| !STORE_ORDER.contains(s)));
    stores
}

/// The size a path of a store is charted at: 100 B if measured, else the smallest.
fn chart_size(cells: &[Cell], store: &str, path: &str) -> Option<usize> {
    let sizes: BTreeSet<usize> = cells
        .iter()
        .filter(|c| c.store == store && c.path == path && c.side == LIBRARY)
        .filter(|c| c.ratio_to_baseline.is_some())
        .map(|c| c.size)
        .collect();
    if sizes.contains(&PREFERRED_SIZE) {
        Some(PREFERRED_SIZE)
    } else {
        sizes.first().copied()
    }
}

/// A human size: `100 B`, `64 KiB`, `1 MiB`; `–` for 0 (does not apply).
fn size_label(size: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    match size {
        0 => "–".to_owned(),
        s if s >= MIB && s % MIB == 0 => format!("{} MiB", s / MIB),
        s if s >= KIB && s % KIB == 0 => format!("{} KiB", s / KIB),
        s => format!("{s} B"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A tick step giving about five ticks up to `max`.
fn tick_step(max: f64) -> f64 {
    [
        0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 20.0, 25.0, 50.0, 100.0,
    ]
    .into_iter()
    .find(|step| max / step <= 6.0)
    .unwrap_or(max / 5.0)
}

/// The chart, a self-contained SVG document (no scripts, no external fonts or images).
fn svg(cells: &[Cell], title: &str) -> String {
    let stores = charted_stores(cells);
    let callers: Vec<usize> = cells
        .iter()
        .filter(|c| c.side == LIBRARY && c.ratio_to_baseline.is_some())
        .map(|c| c.callers)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let colour = |callers_value: usize| {
        let i = callers
            .iter()
            .position(|&c| c == callers_value)
            .unwrap_or(0);
        PALETTE[i % PALETTE.len()]
    };
    let panels = stores.len().max(1) as f64;
    let height = HEADER + panels * PANEL_HEIGHT + (panels - 1.0) * PANEL_GAP + FOOTER;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="13">"#
    );
    let _ = writeln!(s, "<title>{}</title>", escape(title));
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="30" text-anchor="middle" font-size="19" font-weight="bold" fill="#222">{}</text>"##,
        WIDTH / 2.0,
        escape(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="52" text-anchor="middle" fill="#555">library time per operation ÷ hand-written (bars: the same statements; marks: the fewest hops), median of interleaved rounds; lower is better</text>"##,
        WIDTH / 2.0
    );

    // Legend: one swatch per number of callers, then the two lines.
    let mut x = MARGIN_LEFT;
    let y = 74.0;
    for &c in &callers {
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="14" height="14" fill="{}"/>"#,
            y - 11.0,
            colour(c)
        );
        let label = if c == 1 {
            "1 caller".to_owned()
        } else {
            format!("{c} callers")
        };
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{y}" fill="#222">{label}</text>"##,
            x + 20.0
        );
        x += 40.0 + 8.0 * label.len() as f64;
    }
    x += 12.0;
    let _ = writeln!(
        s,
        r##"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="#222" stroke-width="1.5"/>"##,
        y - 4.0,
        x + 28.0,
        y - 4.0
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{y}" fill="#222">1.00 = as fast as by hand</text>"##,
        x + 34.0
    );
    x += 34.0 + 190.0;
    let _ = writeln!(
        s,
        r##"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="6 4"/>"##,
        y - 4.0,
        x + 28.0,
        y - 4.0
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{y}" fill="#c0392b">target {TARGET:.2}</text>"##,
        x + 34.0
    );
    if cells.iter().any(|c| c.ratio_to_floor.is_some()) {
        x += 34.0 + 90.0;
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="#111" stroke-width="3"/>"##,
            y - 4.0,
            x + 20.0,
            y - 4.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{y}" fill="#222">library / floor</text>"##,
            x + 26.0
        );
    }

    if stores.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#555">no library cell with a baseline ratio in these results</text>"##,
            WIDTH / 2.0,
            HEADER + PANEL_HEIGHT / 2.0
        );
    }
    for (i, store) in stores.iter().enumerate() {
        let top = HEADER + i as f64 * (PANEL_HEIGHT + PANEL_GAP);
        panel(&mut s, cells, store, top, &callers, &colour);
    }
    let skipped: Vec<&str> = ordered(cells.iter().map(|c| c.store.as_str()))
        .into_iter()
        .filter(|st| !stores.contains(st))
        .collect();
    if !skipped.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{MARGIN_LEFT}" y="{}" fill="#777" font-size="12">Not charted (no hand-written baseline): {}. See the tables in docs/benchmarks.md.</text>"##,
            height - 12.0,
            escape(&skipped.join(", "))
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One store's panel, its plot area starting at `top`.
fn panel(
    s: &mut String,
    cells: &[Cell],
    store: &str,
    top: f64,
    callers: &[usize],
    colour: &dyn Fn(usize) -> &'static str,
) {
    let plot_top = top + 26.0;
    let plot_bottom = top + PANEL_HEIGHT - 40.0;
    let plot_height = plot_bottom - plot_top;
    let left = MARGIN_LEFT;
    let right = WIDTH - MARGIN_RIGHT;

    let paths = ordered(
        cells
            .iter()
            .filter(|c| c.store == store && c.side == LIBRARY && c.ratio_to_baseline.is_some())
            .map(|c| c.path.as_str()),
    );
    let library = |path: &str, size: usize, n: usize| {
        cells.iter().find(|c| {
            c.store == store
                && c.side == LIBRARY
                && c.path == path
                && c.size == size
                && c.callers == n
        })
    };
    let bar = |path: &str, size: usize, n: usize| {
        library(path, size, n)
            .and_then(|c| c.ratio_to_baseline)
            .filter(|r| r.is_finite())
    };
    // The ratio to the floor baseline, drawn as a mark across the bar, where measured.
    let floor_mark = |path: &str, size: usize, n: usize| {
        library(path, size, n)
            .and_then(|c| c.ratio_to_floor)
            .filter(|r| r.is_finite())
    };
    let max_ratio = cells
        .iter()
        .filter(|c| c.store == store && c.side == LIBRARY)
        .flat_map(|c| [c.ratio_to_baseline, c.ratio_to_floor])
        .flatten()
        .filter(|r| r.is_finite())
        .fold(TARGET, f64::max);
    // Headroom for the values over the bars; outliers beyond the cap are clipped (and say so),
    // so that the region around 1.00 and the target stays readable.
    let top_value = (max_ratio * 1.12).min(Y_CAP);
    let step = tick_step(top_value);
    let y_max = (top_value / step).ceil() * step;
    let y = |value: f64| plot_bottom - value.clamp(0.0, y_max) / y_max * plot_height;

    let _ = writeln!(s, r#"<g class="panel" data-store="{}">"#, escape(store));
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="{}" font-size="16" font-weight="bold" fill="#222">{}</text>"##,
        top + 14.0,
        escape(store)
    );
    // Y axis: grid, ticks, label.
    let mut tick = 0.0;
    while tick <= y_max + step / 1000.0 {
        let ty = y(tick);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{ty:.1}" x2="{right}" y2="{ty:.1}" stroke="#e4e4e4"/>"##
        );
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{ty:.1}" x2="{left}" y2="{ty:.1}" stroke="#444"/>"##,
            left - 5.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{:.1}" text-anchor="end" fill="#444" font-size="12">{tick:.2}</text>"##,
            left - 8.0,
            ty + 4.0
        );
        tick += step;
    }
    let mid = (plot_top + plot_bottom) / 2.0;
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{mid:.1}" text-anchor="middle" fill="#444" font-size="12" transform="rotate(-90 {} {mid:.1})">library / raw (time per operation)</text>"##,
        left - 50.0,
        left - 50.0
    );
    let _ = writeln!(
        s,
        r##"<line x1="{left}" y1="{plot_top}" x2="{left}" y2="{plot_bottom}" stroke="#444"/>"##
    );
    let _ = writeln!(
        s,
        r##"<line x1="{left}" y1="{plot_bottom}" x2="{right}" y2="{plot_bottom}" stroke="#444"/>"##
    );

    // Bars.
    let groups = paths.len().max(1) as f64;
    let group_width = (right - left) / groups;
    let slots = callers.len().max(1) as f64;
    let bar_width = ((group_width * 0.78) / slots).min(46.0);
    // The values over the bars, written after the reference lines so that they stay readable.
    let mut values = String::new();
    for (g, path) in paths.iter().enumerate() {
        let centre = left + group_width * (g as f64 + 0.5);
        let size = chart_size(cells, store, path).unwrap_or(0);
        let first = centre - bar_width * slots / 2.0;
        for (k, &n) in callers.iter().enumerate() {
            let bx = first + bar_width * k as f64;
            if let Some(floor) = floor_mark(path, size, n) {
                let _ = writeln!(
                    values,
                    r##"<line class="floor" data-path="{}" data-callers="{n}" data-ratio="{floor:.2}" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#111" stroke-width="3"><title>{} {} ({}), {n} callers: library / floor {floor:.2}</title></line>"##,
                    escape(path),
                    bx + 1.0,
                    y(floor),
                    bx + bar_width - 1.0,
                    y(floor),
                    escape(store),
                    escape(path),
                    size_label(size),
                );
            }
            match bar(path, size, n) {
                Some(ratio) => {
                    let top_y = y(ratio);
                    let _ = writeln!(
                        s,
                        r#"<rect class="bar" data-path="{}" data-callers="{n}" data-ratio="{ratio:.2}" x="{:.1}" y="{top_y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {} ({}), {n} callers: {ratio:.2}</title></rect>"#,
                        escape(path),
                        bx + 1.0,
                        bar_width - 2.0,
                        plot_bottom - top_y,
                        colour(n),
                        escape(store),
                        escape(path),
                        size_label(size),
                    );
                    if ratio > y_max {
                        // Clipped: the value inside the bar's top, under a break mark.
                        let _ = writeln!(
                            values,
                            r##"<path class="clipped" d="M{:.1} {:.1} l{:.1} -6 M{:.1} {:.1} l{:.1} -6" stroke="#ffffff" stroke-width="2"/>"##,
                            bx + 1.0,
                            top_y + 12.0,
                            bar_width - 2.0,
                            bx + 1.0,
                            top_y + 17.0,
                            bar_width - 2.0,
                        );
                        let _ = writeln!(
                            values,
                            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#ffffff" font-size="10" font-weight="bold">{ratio:.2}</text>"##,
                            bx + bar_width / 2.0,
                            top_y + 30.0
                        );
                    } else {
                        let _ = writeln!(
                            values,
                            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#222" font-size="10" stroke="#ffffff" stroke-width="3" paint-order="stroke">{ratio:.2}</text>"##,
                            bx + bar_width / 2.0,
                            top_y - 4.0
                        );
                    }
                }
                None => {
                    let _ = writeln!(
                        s,
                        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#999" font-size="10">n/a</text>"##,
                        bx + bar_width / 2.0,
                        plot_bottom - 4.0
                    );
                }
            }
        }
        let _ = writeln!(
            s,
            r##"<text x="{centre:.1}" y="{:.1}" text-anchor="middle" fill="#222">{}</text>"##,
            plot_bottom + 18.0,
            escape(path)
        );
        if size != 0 {
            let _ = writeln!(
                s,
                r##"<text x="{centre:.1}" y="{:.1}" text-anchor="middle" fill="#777" font-size="11">{}</text>"##,
                plot_bottom + 33.0,
                size_label(size)
            );
        }
    }

    // Reference lines, over the bars.
    let one = y(1.0);
    let _ = writeln!(
        s,
        r##"<line class="baseline" x1="{left}" y1="{one:.1}" x2="{right}" y2="{one:.1}" stroke="#222" stroke-width="1.5"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{:.1}" fill="#222" font-size="12">1.00</text>"##,
        right + 6.0,
        one + 4.0
    );
    let target = y(TARGET);
    let _ = writeln!(
        s,
        r##"<line class="target" x1="{left}" y1="{target:.1}" x2="{right}" y2="{target:.1}" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="6 4"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{:.1}" fill="#c0392b" font-size="12">target {TARGET:.2}</text>"##,
        right + 6.0,
        // Above its line, and never over the 1.00 label when the two lines are close.
        (target - 2.0).min(one - 10.0)
    );
    s.push_str(&values);
    s.push_str("</g>\n");
}

fn ops(value: f64) -> String {
    format!("{value:.0}")
}

fn micros(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// The tables, one per store: every path, size and number of callers measured, library and
/// raw side by side.
fn markdown(cells: &[Cell]) -> String {
    let mut out = String::new();
    for store in table_stores(cells) {
        let _ = writeln!(out, "### {store}\n");
        // The inline floor (SQLite: the same SQL on the calling thread), where it was measured.
        let has = |side: &str| cells.iter().any(|c| c.store == store && c.side == side);
        let (inline, floor) = (has(RAW_INLINE), has(FLOOR));
        out.push_str(
            "| path | size | callers | library ops/s | raw ops/s | library / raw | library p50 / p99 (µs) | raw p50 / p99 (µs) |",
        );
        let mut columns = 8;
        if floor {
            out.push_str(" floor ops/s | library / floor |");
            columns += 2;
        }
        if inline {
            out.push_str(" raw_inline ops/s |");
            columns += 1;
        }
        out.push_str(&format!("\n|{}\n", "---|".repeat(columns)));
        let rows = ordered(
            cells
                .iter()
                .filter(|c| {
                    c.store == store && [LIBRARY, RAW, FLOOR, RAW_INLINE].contains(&c.side.as_str())
                })
                .map(|c| (c.path.as_str(), c.size, c.callers)),
        );
        let find = |side: &str, (path, size, callers): (&str, usize, usize)| {
            cells.iter().find(|c| {
                c.store == store
                    && c.side == side
                    && c.path == path
                    && c.size == size
                    && c.callers == callers
            })
        };
        for row in rows {
            let library = find(LIBRARY, row);
            let raw = find(RAW, row);
            let dash = || "–".to_owned();
            let _ = write!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.0,
                size_label(row.1),
                row.2,
                library.map_or_else(dash, |c| ops(c.ops_per_sec)),
                raw.map_or_else(dash, |c| ops(c.ops_per_sec)),
                library
                    .and_then(|c| c.ratio_to_baseline)
                    .map_or_else(dash, |r| format!("{r:.2}")),
                library.map_or_else(dash, |c| format!(
                    "{} / {}",
                    micros(c.p50_us),
                    micros(c.p99_us)
                )),
                raw.map_or_else(dash, |c| format!(
                    "{} / {}",
                    micros(c.p50_us),
                    micros(c.p99_us)
                )),
            );
            if floor {
                let _ = write!(
                    out,
                    " {} | {} |",
                    find(FLOOR, row).map_or_else(dash, |c| ops(c.ops_per_sec)),
                    library
                        .and_then(|c| c.ratio_to_floor)
                        .map_or_else(dash, |r| format!("{r:.2}")),
                );
            }
            if inline {
                let no_hop = find(RAW_INLINE, row).map_or_else(dash, |c| ops(c.ops_per_sec));
                let _ = write!(out, " {no_hop} |");
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(store: &str, path: &str, size: usize, callers: usize, side: &str, ops: f64) -> Cell {
        Cell {
            store: store.to_owned(),
            path: path.to_owned(),
            size,
            callers,
            side: side.to_owned(),
            ops_per_sec: ops,
            p50_us: 1_000_000.0 / ops,
            p99_us: 3_000_000.0 / ops,
            ratio_to_baseline: None,
            ratio_to_floor: None,
        }
    }

    /// Library and raw cells of `store` for `path` at `size`, the library at `ratio` × raw.
    fn pair(store: &str, path: &str, size: usize, callers: usize, ratio: f64) -> [Cell; 2] {
        let raw = cell(store, path, size, callers, RAW, 10_000.0);
        let mut library = cell(store, path, size, callers, LIBRARY, 10_000.0 * ratio);
        library.ratio_to_baseline = Some(ratio);
        [library, raw]
    }

    fn synthetic() -> Vec<Cell> {
        let mut cells = vec![cell("memory", "fresh_key", 0, 1, LIBRARY, 50_000.0)];
        for store in ["redis", "sqlite"] {
            for (k, callers) in [1, 8, 32].into_iter().enumerate() {
                cells.extend(pair(store, "fresh_key", 0, callers, 0.9 + 0.01 * k as f64));
                for size in [100, 65_536, 1_048_576] {
                    cells.extend(pair(
                        store,
                        "replay",
                        size,
                        callers,
                        1.0 + size as f64 / 1e7,
                    ));
                }
                cells.extend(pair(store, "mismatch", 100, callers, 1.25));
            }
        }
        cells
    }

    #[test]
    fn svg_has_one_panel_per_store_with_a_baseline_and_three_bars_per_path() {
        let svg = svg(&synthetic(), "test chart");
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        // sqlite before redis (known order), memory not charted.
        let sqlite = svg.find(r#"data-store="sqlite""#).expect("sqlite panel");
        let redis = svg.find(r#"data-store="redis""#).expect("redis panel");
        assert!(sqlite < redis);
        assert!(!svg.contains(r#"data-store="memory""#));
        assert!(svg.contains("Not charted (no hand-written baseline): memory"));
        // 2 stores × 3 paths × 3 callers.
        assert_eq!(svg.matches(r#"class="bar""#).count(), 18);
        assert_eq!(svg.matches(r#"class="target""#).count(), 2);
        assert_eq!(svg.matches(r#"class="baseline""#).count(), 2);
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.contains("library / raw (time per operation)"));
        assert!(svg.contains("32 callers"));
        // Replay is charted at 100 B, not at the larger sizes.
        assert!(svg.contains(r#"data-path="replay" data-callers="8" data-ratio="1.00""#));
        assert!(!svg.contains(r#"data-ratio="1.10" "#));
        assert!(svg.contains(r#"data-path="fresh_key" data-callers="32" data-ratio="0.92""#));
        assert!(!svg.contains("<script"));
    }

    #[test]
    fn svg_marks_the_ratio_to_the_floor_across_its_bar() {
        let mut cells = synthetic();
        assert!(!svg(&cells, "no floor").contains(r#"class="floor""#));
        for c in cells
            .iter_mut()
            .filter(|c| c.store == "sqlite" && c.side == LIBRARY && c.path == "fresh_key")
        {
            c.ratio_to_floor = Some(1.3);
        }
        let svg = svg(&cells, "floor");
        assert_eq!(svg.matches(r#"class="floor""#).count(), 3);
        assert!(svg.contains(r#"data-path="fresh_key" data-callers="8" data-ratio="1.30""#));
        assert!(svg.contains("library / floor"));
    }

    #[test]
    fn svg_clips_outliers_and_writes_their_value() {
        let mut cells = synthetic();
        cells.extend(pair("postgres", "fresh_key", 0, 8, 8.0));
        let svg = svg(&cells, "outlier");
        assert_eq!(svg.matches(r#"class="clipped""#).count(), 1);
        assert!(svg.contains(">8.00</text>"));
        // The postgres axis stops at the cap.
        let postgres = &svg[svg
            .find(r#"data-store="postgres""#)
            .expect("postgres panel")..];
        assert!(postgres.contains(">2.50</text>"));
        assert!(!postgres.contains(">3.00</text>"));
    }

    #[test]
    fn svg_escapes_text_and_handles_no_baseline() {
        let svg = svg(&[cell("memory", "a<b", 0, 1, LIBRARY, 1.0)], "x & y");
        assert!(svg.contains("x &amp; y"));
        assert!(!svg.contains("a<b"));
        assert!(svg.contains("no library cell with a baseline ratio"));
    }

    #[test]
    fn markdown_has_a_table_per_store_and_a_row_per_cell() {
        let md = markdown(&synthetic());
        assert_eq!(md.matches("### ").count(), 3);
        assert!(md.starts_with("### sqlite\n"));
        assert!(md.find("### redis").expect("redis") < md.find("### memory").expect("memory"));
        assert!(md.contains("| fresh_key | – | 1 | 50000 | – | – | 20 / 60 | – |"));
        assert!(
            md.contains("| replay | 64 KiB | 8 | 10066 | 10000 | 1.01 | 99 / 298 | 100 / 300 |")
        );
        assert!(md.contains("| mismatch | 100 B | 32 | 12500 | 10000 | 1.25 |"));
        assert!(!md.contains("raw_inline"));
        let mut with_inline = synthetic();
        with_inline.push(cell("sqlite", "replay", 100, 1, RAW_INLINE, 99_000.0));
        let md = markdown(&with_inline);
        assert!(md.contains("| raw p50 / p99 (µs) | raw_inline ops/s |"));
        assert!(md.contains(
            "| replay | 100 B | 1 | 10000 | 10000 | 1.00 | 100 / 300 | 100 / 300 | 99000 |"
        ));
        assert!(md
            .contains("| replay | 100 B | 8 | 10000 | 10000 | 1.00 | 100 / 300 | 100 / 300 | – |"));
        // 1 memory row, 2 stores × 3 callers × (1 + 3 + 1) rows.
        assert_eq!(
            md.lines()
                .filter(|l| l.starts_with("| ") && !l.starts_with("| path"))
                .count(),
            31
        );
    }

    #[test]
    fn markdown_shows_the_floor_and_the_ratio_to_it_where_measured() {
        let mut cells = synthetic();
        assert!(!markdown(&cells).contains("floor"));
        cells.push(cell("sqlite", "replay", 100, 1, FLOOR, 12_000.0));
        for c in cells.iter_mut().filter(|c| {
            c.store == "sqlite"
                && c.path == "replay"
                && c.size == 100
                && c.callers == 1
                && c.side == LIBRARY
        }) {
            c.ratio_to_floor = Some(1.2);
        }
        let md = markdown(&cells);
        assert!(md.contains("| raw p50 / p99 (µs) | floor ops/s | library / floor |\n|---|---|---|---|---|---|---|---|---|---|\n"));
        assert!(md.contains(
            "| replay | 100 B | 1 | 10000 | 10000 | 1.00 | 100 / 300 | 100 / 300 | 12000 | 1.20 |"
        ));
        assert!(md.contains(
            "| replay | 100 B | 8 | 10000 | 10000 | 1.00 | 100 / 300 | 100 / 300 | – | – |"
        ));
        // A store without a floor keeps its columns.
        let redis = &md[md.find("### redis").expect("redis")..];
        assert!(!redis.contains("floor"));
    }

    #[test]
    fn parse_sizes_and_dates() {
        let line = serde_json::to_string(&pair("sqlite", "replay", 100, 1, 1.2)[0]).expect("json");
        let cells = parse(&format!("{line}\n\n{line}\n")).expect("parses");
        assert_eq!(cells.len(), 2);
        assert!(parse("{").is_err());
        assert_eq!(size_label(100), "100 B");
        assert_eq!(size_label(65_536), "64 KiB");
        assert_eq!(size_label(1_048_576), "1 MiB");
        assert_eq!(utc_date(0), "1970-01-01 UTC");
        assert_eq!(utc_date(1_764_470_000), "2025-11-30 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 UTC");
    }
}
