//! Hand-written SVG charts for the report: best-so-far against trial number, throughput against
//! latency with the Pareto front, and the effect of each parameter. No dependencies, fixed
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

struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn new(xs: &[f64], ys: &[f64]) -> Frame {
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
        }
    }
    fn px(&self, x: f64) -> f64 {
        L + (x - self.x0) / (self.x1 - self.x0) * (W - L - R)
    }
    fn py(&self, y: f64) -> f64 {
        H - B - (y - self.y0) / (self.y1 - self.y0) * (H - T - B)
    }
    fn axes(&self, o: &mut String, title: &str, xl: &str, yl: &str) {
        let _ = write!(
            o,
            r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" font-family="sans-serif" font-size="11"><rect width="{W}" height="{H}" fill="#fff"/><text x="{:.1}" y="18" font-size="13" text-anchor="middle">{}</text>"##,
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
        let sx = step(self.x1 - self.x0);
        let mut x = (self.x0 / sx).ceil() * sx;
        while x <= self.x1 + 1e-9 {
            let p = self.px(x);
            let _ = write!(
                o,
                r##"<line x1="{p:.1}" y1="{:.1}" x2="{p:.1}" y2="{:.1}" stroke="#333"/><text x="{p:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                H - B,
                H - B + 4.0,
                H - B + 16.0,
                fmt_tick(x)
            );
            x += sx;
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

/// The objective against one parameter's value (numeric) or per value (categorical, as index).
pub fn effect(
    param: &str,
    points: &[(f64, f64, Mark)],
    labels: Option<&[String]>,
    ylabel: &str,
) -> String {
    let xs: Vec<f64> = points.iter().map(|p| p.0).collect();
    let ys: Vec<f64> = points.iter().map(|p| p.1).collect();
    let mut f = Frame::new(&xs, &ys);
    if labels.is_some() {
        f.x0 = -0.5;
        f.x1 = xs.iter().cloned().fold(0.0, f64::max) + 0.5;
    }
    let mut o = String::new();
    f.axes(&mut o, &format!("Effect of {param}"), param, ylabel);
    if let Some(ls) = labels {
        for (i, l) in ls.iter().enumerate() {
            let _ = write!(
                o,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
                f.px(i as f64),
                T + 10.0,
                esc(l)
            );
        }
    }
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
}
