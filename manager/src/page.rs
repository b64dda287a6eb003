//! The status page at `/` of `--metrics-addr`: the [`Status`] as one self-contained HTML page
//! (inline CSS and SVG, no script, no external asset) that reloads itself, with a chart of the
//! last hour. Rendered on the server by pure functions.

use std::fmt::Write as _;

use crate::status::{self, Sample, Status, HISTORY_SECS};

/// Seconds between the page's reloads.
pub const REFRESH_SECS: u32 = 5;

/// `<`, `>`, `&`, `"` and `'` escaped.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1100px}\
h1{font-size:1.3em;margin:0 0 .3em}h2{font-size:1.05em;margin:1.4em 0 .4em}\
table{border-collapse:collapse}td,th{padding:.2em .8em;border-bottom:1px solid #ddd;text-align:right}\
td:first-child,th:first-child,.l{text-align:left}th{background:#f3f3f3}\
.ok{color:#176f2c}.bad{color:#b00020;font-weight:bold}.muted{color:#777}\
.big{font-size:1.6em;font-weight:bold}ul{padding-left:1.2em}code{font-size:.95em}\
.legend span{margin-right:1.2em}svg{border:1px solid #ddd;background:#fcfcfc}";

/// One line of the chart: label, colour, value of a sample.
type Series = (&'static str, &'static str, fn(&Sample) -> f64);

/// The lines of the chart.
const SERIES: [Series; 4] = [
    ("staged bundles", "#1f77b4", |s| s.staged as f64),
    ("pending workers", "#ff7f0e", |s| f64::from(s.pending)),
    ("running workers", "#2ca02c", |s| f64::from(s.running)),
    ("launches", "#d62728", |s| f64::from(s.launches)),
];

/// The chart of the last hour up to `now`: one polyline per series, in an inline SVG.
pub fn render_chart(history: &[Sample], now: f64) -> String {
    const W: f64 = 900.0;
    const H: f64 = 220.0;
    const PAD: f64 = 30.0;
    let start = now - HISTORY_SECS;
    let history: Vec<&Sample> = history.iter().filter(|s| s.at >= start).collect();
    let max = history
        .iter()
        .flat_map(|s| SERIES.iter().map(move |(_, _, f)| f(s)))
        .fold(1.0f64, f64::max)
        .ceil();
    let x = |t: f64| PAD + (t - start).clamp(0.0, HISTORY_SECS) / HISTORY_SECS * (W - 2.0 * PAD);
    let y = |v: f64| H - PAD - v / max * (H - 2.0 * PAD);
    let mut svg = format!(
        "<svg id=\"chart\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" aria-label=\"last hour\">"
    );
    // Axes, the top value and the time marks.
    let _ = write!(
        svg,
        "<line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/>\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" stroke=\"#999\"/>\
         <text x=\"4\" y=\"{t}\" font-size=\"11\">{max}</text>\
         <text x=\"4\" y=\"{b}\" font-size=\"11\">0</text>",
        b = H - PAD,
        r = W - PAD,
        t = PAD + 4.0,
    );
    for (mins, label) in [(60.0, "-60 min"), (30.0, "-30 min"), (0.0, "now")] {
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{label}</text>",
            x(now - mins * 60.0),
            H - PAD + 16.0
        );
    }
    for (name, colour, f) in SERIES {
        let points: Vec<String> = history
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.at), y(f(s))))
            .collect();
        let Some(last) = points.last() else {
            continue;
        };
        // The newest value as a dot: a few minutes of samples are a short line at the right.
        let (cx, cy) = last.split_once(',').unwrap_or(("0", "0"));
        let _ = write!(
            svg,
            "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"3\" fill=\"{colour}\"/>"
        );
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\">\
             <title>{name}</title></polyline>",
            points.join(" ")
        );
    }
    svg.push_str("</svg><div class=\"legend\">");
    for (name, colour, _) in SERIES {
        let _ = write!(
            svg,
            "<span><b style=\"color:{colour}\">&#9632;</b> {name}</span>"
        );
    }
    svg.push_str("</div>");
    svg
}

fn cell(out: &mut String, v: impl std::fmt::Display) {
    let _ = write!(out, "<td>{}</td>", escape(&v.to_string()));
}

/// The "Waiting bundles" table: why each staged bundle is not running yet (every field
/// escaped: uuids and details carry user data).
fn waiting_bundles(h: &mut String, s: &Status) {
    let tiers = s.bundles.iter().any(|b| b.tier.is_some());
    let _ = write!(
        h,
        "<h2>Waiting bundles: {}</h2><table id=\"bundles\"><tr><th class=\"l\">bundle</th>\
         <th class=\"l\">reason</th>{}<th class=\"l\">detail</th><th>since</th></tr>",
        s.bundles.len() as u64 + s.bundles_unlisted,
        if tiers {
            "<th class=\"l\">tier</th>"
        } else {
            ""
        }
    );
    for b in &s.bundles {
        let _ = write!(
            h,
            "<tr><td><code title=\"{}\">{}</code></td><td class=\"l\">{}</td>",
            escape(&b.uuid),
            escape(&status::short_uuid(&b.uuid)),
            escape(b.reason.name())
        );
        if tiers {
            let _ = write!(
                h,
                "<td class=\"l\">{}</td>",
                escape(b.tier.as_deref().unwrap_or("-"))
            );
        }
        let _ = write!(
            h,
            "<td class=\"l\">{}</td><td>{}</td></tr>",
            escape(&b.detail),
            escape(&status::since_text(b.since))
        );
    }
    h.push_str("</table>");
    if s.bundles_unlisted > 0 {
        let _ = write!(
            h,
            "<p class=\"muted\">&hellip; and {} more (past the first {}, or counted but not \
             read)</p>",
            s.bundles_unlisted,
            status::BUNDLES_MAX
        );
    }
}

/// The whole page for `now`.
pub fn render_html(s: &Status, now: f64) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>cl-worker-manager: {} staged</title><style>{CSS}</style></head><body>",
        s.staged()
    );
    let _ = write!(
        h,
        "<h1>cl-worker-manager <span class=\"muted\">{} backend, server <code>{}</code></span></h1>",
        escape(&s.backend),
        escape(&s.server)
    );
    let _ = write!(
        h,
        "<p class=\"muted\" id=\"updated\">{} &middot; reloads every {REFRESH_SECS} s &middot; \
         <a href=\"/status\">/status</a> &middot; <a href=\"/metrics\">/metrics</a></p>",
        match s.updated_at {
            Some(t) => format!(
                "last tick {} ago ({})",
                status::duration(now - t),
                status::clock(t)
            ),
            None => "no tick yet".into(),
        }
    );
    let class = |ok: bool| if ok { "ok" } else { "bad" };
    let _ = write!(
        h,
        "<p>Health: <span id=\"health\" class=\"{}\">{}</span><br>\
         Breaker: <span id=\"breaker\" class=\"{}\">{}</span>",
        class(s.health.ok()),
        escape(&s.health_line()),
        class(s.breaker.state == "closed" || s.breaker.state.is_empty()),
        escape(&s.breaker_line())
    );
    if let Some(l) = s.lease_line() {
        let leader = s.lease.as_ref().is_some_and(|l| l.leader);
        let _ = write!(
            h,
            "<br>Lease: <span id=\"lease\" class=\"{}\">{}</span>",
            if leader { "ok" } else { "muted" },
            escape(&l)
        );
    }
    if let Some(p) = s.pool_line() {
        let _ = write!(h, "<br>Pool: <span id=\"pool\">{}</span>", escape(&p));
    }
    for p in s.pool_problems() {
        let _ = write!(h, "<br><span class=\"bad\">{}</span>", escape(&p));
    }
    h.push_str("</p>");

    if !s.tiers.is_empty() {
        h.push_str(
            "<h2>Tiers</h2><table id=\"tiers\"><tr><th class=\"l\">tier</th>\
             <th class=\"l\">backend</th><th>workers</th><th>cap</th><th>running</th>\
             <th>routed</th><th>overflow after</th><th>this month</th><th>budget</th>\
             <th class=\"l\">state</th></tr>",
        );
        for t in &s.tiers {
            h.push_str("<tr>");
            cell(&mut h, &t.name);
            cell(&mut h, &t.backend);
            cell(&mut h, t.pending + t.running);
            cell(&mut h, t.max_workers);
            cell(&mut h, t.running);
            cell(&mut h, t.routed);
            cell(
                &mut h,
                t.overflow_after_secs
                    .map_or_else(|| "-".into(), status::duration),
            );
            cell(&mut h, format!("{:.2}", t.month_cost));
            cell(
                &mut h,
                t.budget.map_or_else(|| "-".into(), |b| format!("{b:.2}")),
            );
            cell(&mut h, t.held.as_deref().unwrap_or("launching"));
            h.push_str("</tr>");
        }
        h.push_str("</table><p class=\"muted\">Below: the first tier.</p>");
    }

    // Demand.
    let unsched = s.plan.as_ref().map_or(&[][..], |p| &p.unschedulable[..]);
    let _ = write!(
        h,
        "<h2>Staged bundles: <span id=\"staged-count\" class=\"big\">{}</span> \
         <span class=\"muted\">({})</span></h2>\
         <table id=\"staged\"><tr><th>shape</th><th class=\"l\">size</th><th>staged</th><th>fit idle workers</th>\
         <th>workers needed</th><th>to launch</th><th>throttled</th><th>over capacity</th></tr>",
        s.staged(),
        escape(&s.staged_note())
    );
    for sh in &s.shapes {
        let p = s.plan.as_ref().and_then(|p| p.shape(&sh.name));
        h.push_str("<tr>");
        cell(&mut h, &sh.name);
        let _ = write!(
            h,
            "<td class=\"l\">{}</td>",
            escape(&status::shape_size(sh))
        );
        cell(&mut h, p.map_or(0, |p| p.staged));
        cell(&mut h, p.map_or(0, |p| p.covered_by_idle));
        cell(&mut h, p.map_or(0, |p| p.workers_needed));
        cell(&mut h, p.map_or(0, |p| p.launch_wanted));
        cell(&mut h, p.map_or(0, |p| p.throttled));
        cell(&mut h, p.map_or(0, |p| p.over_capacity));
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    if !unsched.is_empty() {
        h.push_str("<ul id=\"unschedulable\">");
        for u in unsched {
            let _ = write!(
                h,
                "<li><code>{}</code>: {}</li>",
                escape(&u.uuid),
                escape(&u.reason)
            );
        }
        h.push_str("</ul>");
    }
    waiting_bundles(&mut h, s);

    // Capacity.
    let (pending, running): (u32, u32) = s
        .workers
        .iter()
        .fold((0, 0), |(p, r), w| (p + w.pending, r + w.running));
    let _ = write!(
        h,
        "<h2>Workers: {} <span class=\"muted\">({pending} pending, {running} running; \
         min {}, max {})</span></h2><table id=\"workers\"><tr><th>shape</th><th>pending</th>\
         <th>running</th><th>lost before check-in</th></tr>",
        pending + running,
        s.min_workers,
        s.max_workers
    );
    for w in &s.workers {
        h.push_str("<tr>");
        cell(&mut h, &w.shape);
        cell(&mut h, w.pending);
        cell(&mut h, w.running);
        cell(&mut h, w.lost_before_checkin);
        h.push_str("</tr>");
    }
    h.push_str("</table>");

    h.push_str("<h2>Last hour</h2>");
    h.push_str(&render_chart(&s.history, now));

    h.push_str(
        "<h2>Recent decisions</h2><table id=\"decisions\"><tr><th>time</th><th class=\"l\">decision</th></tr>",
    );
    for d in s.decisions.iter().rev().take(20) {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"l\">{}</td></tr>",
            status::clock(d.at),
            escape(&d.text)
        );
    }
    h.push_str("</table></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::sample_status;

    #[test]
    fn page_shows_the_status() {
        let s = sample_status();
        let page = render_html(&s, 1003.0);
        for want in [
            "<meta http-equiv=\"refresh\" content=\"5\">",
            "<span id=\"staged-count\" class=\"big\">3</span>",
            "<table id=\"workers\">",
            "<tr><td>default</td><td>1</td><td>0</td><td>1</td></tr>",
            "<tr><td>default</td><td class=\"l\">1 CPU, 0 GPU, 2.0 GiB</td><td>2</td><td>0</td>\
             <td>2</td><td>1</td><td>0</td><td>0</td></tr>",
            "<th>throttled</th><th>over capacity</th></tr>",
            "<li><code>0x3</code>: fits no worker shape: 64 cpus &gt; largest 1</li>",
            "server ok; backend ok",
            "closed, 0 failed launches in a row, no back-off",
            "launched 1 worker of shape default",
            "<svg id=\"chart\"",
            // Why each staged bundle waits: 0x1 for the pending job j1, 0x2 for the worker
            // launched for it, 0x3 never.
            "<h2>Waiting bundles: 3</h2><table id=\"bundles\">",
            "<tr><td><code title=\"0x1\">0x1</code></td><td class=\"l\">waiting_for_worker</td>\
             <td class=\"l\">pending job j1 of shape default can take it</td><td>-</td></tr>",
            "<tr><td><code title=\"0x2\">0x2</code></td><td class=\"l\">waiting_for_worker</td>\
             <td class=\"l\">a worker of shape default was launched for it at this tick</td>\
             <td>00:16:40Z</td></tr>",
            "<tr><td><code title=\"0x3\">0x3</code></td><td class=\"l\">unschedulable</td>\
             <td class=\"l\">requests 64 CPUs, the largest shape has 1: 63 over</td><td>-</td></tr>",
        ] {
            assert!(page.contains(want), "{want:?} not in\n{page}");
        }
        // Self-contained: nothing fetched from elsewhere, no script.
        for banned in ["<script", "src=", "<link", "@import", "https://"] {
            assert!(!page.contains(banned), "{banned} in the page");
        }
    }

    #[test]
    fn text_is_escaped() {
        let mut s = sample_status();
        s.health.server_error = Some("<b>bad</b> & \"worse\"".into());
        let page = render_html(&s, 1000.0);
        assert!(page.contains("&lt;b&gt;bad&lt;/b&gt; &amp; &quot;worse&quot;"));
        assert!(page.contains("class=\"bad\""));
        assert!(!page.contains("<b>bad</b>"));
        // A bundle's uuid, detail and tier are user data.
        let mut s = sample_status();
        s.bundles[0].uuid = "0x<i>\"u".into();
        s.bundles[0].detail = "<script>x</script>".into();
        s.bundles[0].tier = Some("<t>".into());
        s.bundles_unlisted = 2;
        let page = render_html(&s, 1000.0);
        assert!(!page.contains("<script>") && !page.contains("<i>") && !page.contains("<t>"));
        assert!(page.contains("<code title=\"0x&lt;i&gt;&quot;u\">0x&lt;i&gt;&quot;u</code>"));
        assert!(page.contains("<td class=\"l\">&lt;script&gt;x&lt;/script&gt;</td>"));
        assert!(page.contains("<th class=\"l\">tier</th>"));
        assert!(page.contains("<td class=\"l\">&lt;t&gt;</td>"));
        assert!(page.contains("and 2 more"));
    }

    #[test]
    fn chart_places_the_last_hour() {
        let h = [
            Sample {
                at: 0.0,
                staged: 9,
                ..Default::default()
            },
            Sample {
                at: 3600.0,
                staged: 4,
                pending: 2,
                running: 1,
                launches: 2,
            },
            Sample {
                at: 7200.0,
                staged: 2,
                pending: 0,
                running: 3,
                launches: 0,
            },
        ];
        let svg = render_chart(&h, 7200.0);
        // The sample older than an hour is left out; the top of the axis is the largest value
        // shown; the newest point is at the right edge (x = 900 - 30), the oldest at the left.
        assert!(svg.contains(">4</text>"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("points=\"30.0,"), "{svg}");
        assert!(svg.contains("870.0,"), "{svg}");
        assert!(!svg.contains("9</text>"), "{svg}");
        // No samples: axes and legend, no lines.
        let empty = render_chart(&[], 0.0);
        assert_eq!(empty.matches("<polyline").count(), 0);
        assert!(empty.contains("running workers"));
    }
}
