//! Hand-written SVG charts for the report: best-so-far against trial number, throughput against
//! latency with the Pareto front, and the effect of each parameter (on a log axis for a
//! log-scaled one, with its values as ticks for a categorical one). No dependencies, fixed
//! sizes, numbers formatted with a fixed precision so that snapshots are stable.

use std::fmt::Write as _;

/// A point of a chart with its kind (drawn differently).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mark {
    Ok,
    Infeasible,
    Failed,
    Best,
}

const W: f64 = 640.0;
const H: f64 = 320.0;
const L: f64 = 64.0;
const R: f64 = 16.0;
const T: f64 = 28.0;
const B: f64 = 44.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round tick step for a span.
fn step(span: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / 5.0;
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    p * if m < 1.5 {
        1.0
    } else if m < 3.5 {
        2.0
    } else if m < 7.5 {
        5.0
    } else {
        10.0
    }
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 10.0 || (v - v.round()).abs() < 1e-9 {
        format!("{:.0}", v)
    } else {
        format!("{:.2}", v)
    }
}

/// How an effect chart's x axis shows a parameter's values.
#[derive(Debug, Clone, PartialEq)]
pub enum XAxis<'a> {
    Linear,
    /// A log-scaled parameter: positions by log10, ticks at powers of two (or ten).
    Log,
    /// A categorical parameter: one tick per value, labelled with it, at x = its index.
    Categories(&'a [String]),
}

impl XAxis<'_> {
    fn name(&self) -> &'static str {
        match self {
            XAxis::Linear => "linear",
            XAxis::Log => "log",
            XAxis::Categories(_) => "categorical",
        }
    }
}

struct Frame<'a> {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    /// The x axis; `x0`/`x1` are log10 values on a log axis.
    xaxis: XAxis<'a>,
}

impl<'a> Frame<'a> {
    fn new(xs: &[f64], ys: &[f64]) -> Frame<'a> {
        let fin = |v: &[f64]| -> (f64, f64) {
            let f: Vec<f64> = v.iter().cloned().filter(|x| x.is_finite()).collect();
            if f.is_empty() {
                return (0.0, 1.0);
            }
            let lo = f.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = f.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if hi > lo {
                (lo, hi)
            } else {
                (lo - 0.5 * lo.abs().max(1.0), hi + 0.5 * hi.abs().max(1.0))
            }
        };
        let (x0, x1) = fin(xs);
        let (y0, y1) = fin(ys);
        let pad = (y1 - y0) * 0.08;
        Frame {
            x0,
            x1,
            y0: (y0 - pad).max(if y0 >= 0.0 { 0.0 } else { f64::NEG_INFINITY }),
            y1: y1 + pad,
            xaxis: XAxis::Linear,
        }
    }
    /// The pixel of a data value (on a log axis, of its log10).
    fn px(&self, x: f64) -> f64 {
        let x = if self.xaxis == XAxis::Log {
            x.max(f64::MIN_POSITIVE).log10()
        } else {
            x
        };
        L + (x - self.x0) / (self.x1 - self.x0) * (W - L - R)
    }
    /// The x ticks: positions as data values, and their labels.
    fn x_ticks(&self) -> Vec<(f64, String)> {
        match &self.xaxis {
            XAxis::Categories(labels) => labels
                .iter()
                .enumerate()
                .map(|(i, l)| (i as f64, l.clone()))
                .collect(),
            XAxis::Log => {
                // Powers of two (the steps engine flags come in) up to 13 doublings (14 ticks,
                // about 40 pixels apart on the 560-pixel axis), else powers of ten.
                let (lo, hi) = (10f64.powf(self.x0), 10f64.powf(self.x1));
                let base: f64 = if (hi / lo).log2() <= 13.0 { 2.0 } else { 10.0 };
                let mut t = base.powf((lo.ln() / base.ln()).ceil());
                let mut out = Vec::new();
                while t <= hi * (1.0 + 1e-9) && out.len() < 64 {
                    out.push((t, fmt_tick(t)));
                    t *= base;
                }
                out
            }
            XAxis::Linear => {
                let sx = step(self.x1 - self.x0);
                let mut x = (self.x0 / sx).ceil() * sx;
                let mut out = Vec::new();
                while x <= self.x1 + 1e-9 {
                    out.push((x, fmt_tick(x)));
                    x += sx;
                }
                out
            }
        }
    }
    fn py(&self, y: f64) -> f64 {
        H - B - (y - self.y0) / (self.y1 - self.y0) * (H - T - B)
    }
    fn axes(&self, o: &mut String, title: &str, xl: &str, yl: &str) {
        let _ = write!(
            o,
            r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" font-family="sans-serif" font-size="11" data-x-axis="{}"><rect width="{W}" height="{H}" fill="#fff"/><text x="{:.1}" y="18" font-size="13" text-anchor="middle">{}</text>"##,
            self.xaxis.name(),
            W / 2.0,
            esc(title)
        );
        let _ = write!(
            o,
            r##"<line x1="{L}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><line x1="{L}" y1="{T}" x2="{L}" y2="{:.1}" stroke="#333"/>"##,
            H - B,
            W - R,
            H - B,
            H - B
        );
        for (x, label) in self.x_ticks() {
            let p = self.px(x);
            let _ = write!(
                o,
                r##"<line x1="{p:.1}" y1="{:.1}" x2="{p:.1}" y2="{:.1}" stroke="#333"/><text x="{p:.1}" y="{:.1}" text-anchor="middle" class="x-tick">{}</text>"##,
                H - B,
                H - B + 4.0,
                H - B + 16.0,
                esc(&label)
            );
        }
        let sy = step(self.y1 - self.y0);
        let mut y = (self.y0 / sy).ceil() * sy;
        while y <= self.y1 + 1e-9 {
            let p = self.py(y);
            let _ = write!(
                o,
                r##"<line x1="{L}" y1="{p:.1}" x2="{:.1}" y2="{p:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - R,
                L - 6.0,
                p + 4.0,
                fmt_tick(y)
            );
            y += sy;
        }
        let _ = write!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="14" y="{:.1}" text-anchor="middle" transform="rotate(-90 14 {:.1})">{}</text>"##,
            (L + W - R) / 2.0,
            H - 8.0,
            esc(xl),
            (T + H - B) / 2.0,
            (T + H - B) / 2.0,
            esc(yl)
        );
    }
}

fn mark(o: &mut String, x: f64, y: f64, m: Mark) {
    match m {
        Mark::Ok => {
            let _ = write!(
                o,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="#3b6fb6"/>"##
            );
        }
        Mark::Best => {
            let _ = write!(
                o,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="5" fill="#2a9d4a" stroke="#000"/>"##
            );
        }
        Mark::Infeasible | Mark::Failed => {
            let c = if m == Mark::Failed {
                "#c0392b"
            } else {
                "#e67e22"
            };
            let _ = write!(
                o,
                r##"<path d="M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}" stroke="{c}" stroke-width="2"/>"##,
                x - 4.0,
                y - 4.0,
                x + 4.0,
                y + 4.0,
                x - 4.0,
                y + 4.0,
                x + 4.0,
                y - 4.0
            );
        }
    }
}

/// Objective per search trial (`None` for failed or infeasible ones, drawn on the axis) and the
/// best-so-far step line.
pub fn best_so_far(points: &[(f64, Option<f64>, Mark)], ylabel: &str) -> String {
    let xs: Vec<f64> = points.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = points.iter().filter_map(|p| p.1).collect();
    let f = Frame::new(&xs, &ys);
    let mut o = String::new();
    f.axes(&mut o, "Best so far by trial", "trial", ylabel);
    let mut best: Option<f64> = None;
    let mut path = String::new();
    for (x, y, _) in points {
        if let Some(v) = y {
            if *v > best.unwrap_or(f64::NEG_INFINITY) {
                if let Some(b) = best {
                    let _ = write!(path, "L{:.1} {:.1}", f.px(*x), f.py(b));
                }
                best = Some(*v);
                let _ = write!(
                    path,
                    "{}{:.1} {:.1}",
                    if path.is_empty() { "M" } else { "L" },
                    f.px(*x),
                    f.py(*v)
                );
            }
        }
    }
    if let (Some(b), Some(last)) = (best, points.last()) {
        let _ = write!(path, "L{:.1} {:.1}", f.px(last.0), f.py(b));
        let _ = write!(
            o,
            r##"<path d="{path}" fill="none" stroke="#2a9d4a" stroke-width="2"/>"##
        );
    }
    for (x, y, m) in points {
        let py = match y {
            Some(v) => f.py(*v),
            None => H - B - 6.0,
        };
        mark(&mut o, f.px(*x), py, *m);
    }
    o.push_str("</svg>");
    o
}

/// Throughput against a latency, with the Pareto front (more throughput, less latency).
pub fn pareto(points: &[(f64, f64, Mark)], xlabel: &str, ylabel: &str) -> String {
    let xs: Vec<f64> = points.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.1).collect();
    let f = Frame::new(&xs, &ys);
    let mut o = String::new();
    f.axes(
        &mut o,
        "Throughput against latency (Pareto front in green)",
        xlabel,
        ylabel,
    );
    let mut front: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.2 != Mark::Failed)
        .filter(|p| {
            !points.iter().any(|q| {
                q.2 != Mark::Failed && q.0 <= p.0 && q.1 >= p.1 && (q.0 < p.0 || q.1 > p.1)
            })
        })
        .map(|p| (p.0, p.1))
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0));
    if front.len() > 1 {
        let d: Vec<String> = front
            .iter()
            .enumerate()
            .map(|(i, (x, y))| {
                format!(
                    "{}{:.1} {:.1}",
                    if i == 0 { "M" } else { "L" },
                    f.px(*x),
                    f.py(*y)
                )
            })
            .collect();
        let _ = write!(
            o,
            r##"<path d="{}" fill="none" stroke="#2a9d4a" stroke-width="2"/>"##,
            d.join("")
        );
    }
    for (x, y, m) in points {
        mark(&mut o, f.px(*x), f.py(*y), *m);
    }
    o.push_str("</svg>");
    o
}

/// The objective against one parameter's value: numeric on a linear or log axis, or per
/// categorical value (x = the value's index in the labels, which label the ticks).
pub fn effect(param: &str, points: &[(f64, f64, Mark)], xaxis: XAxis, ylabel: &str) -> String {
    let ys: Vec<f64> = points.iter().map(|p| p.1).collect();
    let xs: Vec<f64> = match xaxis {
        // A log axis needs positive values; a non-positive one (not from a log-scaled
        // parameter's range) falls back to linear.
        XAxis::Log if points.iter().all(|p| p.0 > 0.0) => {
            points.iter().map(|p| p.0.log10()).collect()
        }
        _ => points.iter().map(|p| p.0).collect(),
    };
    let mut f = Frame::new(&xs, &ys);
    f.xaxis = match xaxis {
        XAxis::Log if points.iter().any(|p| p.0 <= 0.0) => XAxis::Linear,
        a => a,
    };
    match &f.xaxis {
        XAxis::Categories(labels) => {
            f.x0 = -0.5;
            f.x1 = labels.len().max(1) as f64 - 0.5;
        }
        XAxis::Log => {
            // Half a doubling of room on each side, so that end points are not on the frame.
            let pad = 0.5 * 2f64.log10();
            f.x0 -= pad;
            f.x1 += pad;
        }
        XAxis::Linear => {}
    }
    let mut o = String::new();
    f.axes(&mut o, &format!("Effect of {param}"), param, ylabel);
    for (x, y, m) in points {
        mark(&mut o, f.px(*x), f.py(*y), *m);
    }
    o.push_str("</svg>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_charts_are_closed_svg() {
        assert_eq!(step(100.0), 20.0);
        assert_eq!(step(7.0), 1.0);
        let s = best_so_far(
            &[
                (0.0, Some(10.0), Mark::Ok),
                (1.0, None, Mark::Failed),
                (2.0, Some(12.0), Mark::Best),
            ],
            "tok/s",
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>"));
        assert_eq!(s.matches("<circle").count(), 2);
        let p = pareto(
            &[
                (10.0, 100.0, Mark::Ok),
                (20.0, 150.0, Mark::Ok),
                (30.0, 120.0, Mark::Ok),
            ],
            "ms",
            "tok/s",
        );
        // (30, 120) is dominated by (20, 150): the front is a path through two points.
        let d = p
            .split("<path d=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(d.matches('M').count(), 1, "{d}");
        assert_eq!(d.matches('L').count(), 1, "{d}");
        assert!(!esc("<a&b>").contains('<'));
    }

    fn ticks_of(svg: &str) -> Vec<String> {
        svg.split("class=\"x-tick\">")
            .skip(1)
            .map(|s| s.split('<').next().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn effect_axes_follow_the_parameter_scale() {
        let pts = [
            (32.0, 10.0, Mark::Ok),
            (256.0, 14.0, Mark::Ok),
            (1024.0, 12.0, Mark::Best),
        ];
        let log = effect("max_num_seqs", &pts, XAxis::Log, "tok/s");
        assert!(log.contains("data-x-axis=\"log\""));
        assert_eq!(ticks_of(&log), ["32", "64", "128", "256", "512", "1024"]);
        let lin = effect("max_num_seqs", &pts, XAxis::Linear, "tok/s");
        assert!(lin.contains("data-x-axis=\"linear\""));
        assert_eq!(ticks_of(&lin), ["200", "400", "600", "800", "1000"]);
        let labels = vec!["fp8".to_string(), "none".to_string()];
        let cat = effect(
            "quantization",
            &[(0.0, 10.0, Mark::Ok), (1.0, 12.0, Mark::Ok)],
            XAxis::Categories(&labels),
            "tok/s",
        );
        assert_eq!(ticks_of(&cat), ["fp8", "none"]);
        // A non-positive value cannot go on a log axis: linear instead.
        let zero = effect(
            "x",
            &[(0.0, 1.0, Mark::Ok), (8.0, 2.0, Mark::Ok)],
            XAxis::Log,
            "y",
        );
        assert!(zero.contains("data-x-axis=\"linear\""));
    }
}
