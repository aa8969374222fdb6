//! Cron-expression schedules for the daemon's nightly re-tuning.
//!
//! All times are UTC; there is no time-zone or daylight-saving handling. The
//! accepted syntax is the classic five-field form `minute hour day-of-month
//! month day-of-week`, fields separated by whitespace. Each field is a comma
//! list of items; an item is `*`, a number `a`, a range `a-b`, or any of those
//! with a step: `*/n`, `a-b/n`, `a/n` (from `a` to the field's maximum).
//! Months accept `jan`..`dec` and weekdays `sun`..`sat` (case-insensitive);
//! day-of-week is 0-7 where both 0 and 7 mean Sunday. The aliases `@hourly`,
//! `@daily`, `@midnight`, `@weekly`, `@monthly`, `@yearly` and `@annually` are
//! accepted too. As in Vixie cron, when both day-of-month and day-of-week are
//! restricted (neither starts with `*`) a day matches if either one matches.

use std::fmt;
use std::str::FromStr;

use crate::util::{civil_from_days, days_from_civil};

/// Why a cron expression was rejected.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    #[error("expected 5 fields (minute hour day-of-month month day-of-week), found {0}")]
    FieldCount(usize),
    #[error("{field}: {value} is out of range {min}-{max}")]
    OutOfRange {
        field: &'static str,
        value: String,
        min: u32,
        max: u32,
    },
    #[error("{field}: cannot parse {token:?}")]
    BadToken { field: &'static str, token: String },
    #[error("{field}: step must be at least 1 in {token:?}")]
    ZeroStep { field: &'static str, token: String },
    #[error("{field}: range {start}-{end} is reversed")]
    ReversedRange {
        field: &'static str,
        start: u32,
        end: u32,
    },
    #[error("unknown alias {0:?} (expected @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually)")]
    UnknownAlias(String),
}

/// A parsed cron schedule; each field is a bit set of the values it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    expr: String,
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    days_of_week: u64,
    dom_restricted: bool,
    dow_restricted: bool,
}

struct FieldSpec {
    name: &'static str,
    min: u32,
    max: u32,
    /// Names for the values `min`, `min + 1`, ...
    names: &'static [&'static str],
}

const MONTH_NAMES: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAY_NAMES: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

#[rustfmt::skip]
const FIELDS: [FieldSpec; 5] = [
    FieldSpec { name: "minute", min: 0, max: 59, names: &[] },
    FieldSpec { name: "hour", min: 0, max: 23, names: &[] },
    FieldSpec { name: "day-of-month", min: 1, max: 31, names: &[] },
    FieldSpec { name: "month", min: 1, max: 12, names: MONTH_NAMES },
    FieldSpec { name: "day-of-week", min: 0, max: 7, names: DAY_NAMES },
];

/// How far ahead `next_after` looks before giving up, in days.
const HORIZON_DAYS: i64 = 5 * 366;

impl Schedule {
    /// Parses a five-field cron expression or an `@alias`.
    pub fn parse(expr: &str) -> Result<Schedule, CronError> {
        let trimmed = expr.trim();
        let body = if trimmed.starts_with('@') {
            match trimmed.to_ascii_lowercase().as_str() {
                "@hourly" => "0 * * * *",
                "@daily" | "@midnight" => "0 0 * * *",
                "@weekly" => "0 0 * * 0",
                "@monthly" => "0 0 1 * *",
                "@yearly" | "@annually" => "0 0 1 1 *",
                _ => return Err(CronError::UnknownAlias(trimmed.to_string())),
            }
        } else {
            trimmed
        };
        let fields: Vec<&str> = body.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(CronError::FieldCount(fields.len()));
        }
        let mut masks = [0u64; 5];
        for ((mask, spec), text) in masks.iter_mut().zip(&FIELDS).zip(&fields) {
            *mask = parse_field(spec, text)?;
        }
        // Fold day-of-week 7 onto 0: both mean Sunday.
        let dow = masks[4];
        Ok(Schedule {
            expr: trimmed.to_string(),
            minutes: masks[0],
            hours: masks[1],
            days_of_month: masks[2],
            months: masks[3],
            days_of_week: (dow & 0x7f) | ((dow >> 7) & 1),
            dom_restricted: !fields[2].starts_with('*'),
            dow_restricted: !fields[4].starts_with('*'),
        })
    }

    /// The original expression, trimmed.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The smallest whole minute strictly after `unix_secs` that matches, as
    /// unix seconds (UTC), or `None` if nothing matches within five years.
    pub fn next_after(&self, unix_secs: i64) -> Option<i64> {
        let start = unix_secs.div_euclid(60) + 1; // in minutes; cannot overflow
        let mut day = start.div_euclid(1440);
        let mut minute_of_day = start.rem_euclid(1440) as u32;
        let last_day = day + HORIZON_DAYS;
        while day <= last_day {
            let (year, month, dom) = civil_from_days(day);
            if !has_bit(self.months, month) {
                // Skip to the first day of the next month.
                day = if month == 12 {
                    days_from_civil(year + 1, 1, 1)
                } else {
                    days_from_civil(year, month + 1, 1)
                };
                minute_of_day = 0;
                continue;
            }
            if self.day_matches(dom, weekday(day)) {
                if let Some((hour, minute)) = self.time_from(minute_of_day) {
                    // In minutes this cannot overflow; in seconds it can.
                    return (day * 1440 + i64::from(hour * 60 + minute)).checked_mul(60);
                }
            }
            day += 1;
            minute_of_day = 0;
        }
        None
    }

    fn day_matches(&self, dom: u32, dow: u32) -> bool {
        let dom_ok = has_bit(self.days_of_month, dom);
        let dow_ok = has_bit(self.days_of_week, dow);
        if self.dom_restricted && self.dow_restricted {
            dom_ok || dow_ok
        } else {
            dom_ok && dow_ok
        }
    }

    /// The first matching (hour, minute) at or after `minute_of_day` today.
    fn time_from(&self, minute_of_day: u32) -> Option<(u32, u32)> {
        let (hour, minute) = (minute_of_day / 60, minute_of_day % 60);
        if has_bit(self.hours, hour) {
            if let Some(m) = next_bit(self.minutes, minute) {
                return Some((hour, m));
            }
        }
        let hour = next_bit(self.hours, hour + 1)?;
        Some((hour, next_bit(self.minutes, 0)?))
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.expr)
    }
}

impl FromStr for Schedule {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Schedule::parse(s)
    }
}

fn has_bit(mask: u64, bit: u32) -> bool {
    bit < 64 && mask & (1 << bit) != 0
}

/// The lowest set bit at position `from` or above.
fn next_bit(mask: u64, from: u32) -> Option<u32> {
    let rest = mask.checked_shr(from)?;
    (rest != 0).then(|| from + rest.trailing_zeros())
}

fn parse_field(spec: &FieldSpec, text: &str) -> Result<u64, CronError> {
    let mut mask = 0;
    for item in text.split(',') {
        mask |= parse_item(spec, item)?;
    }
    Ok(mask)
}

fn parse_item(spec: &FieldSpec, item: &str) -> Result<u64, CronError> {
    let bad = || bad_token(spec, item);
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => {
            let step = parse_digits(step).ok_or_else(bad)?.map_err(|_| bad())?;
            if step == 0 {
                return Err(CronError::ZeroStep {
                    field: spec.name,
                    token: item.to_string(),
                });
            }
            (range, Some(step))
        }
        None => (item, None),
    };
    let (start, end) = if range == "*" {
        (spec.min, spec.max)
    } else if let Some((a, b)) = range.split_once('-') {
        (parse_value(spec, a, item)?, parse_value(spec, b, item)?)
    } else {
        let a = parse_value(spec, range, item)?;
        (a, if step.is_some() { spec.max } else { a })
    };
    if start > end {
        return Err(CronError::ReversedRange {
            field: spec.name,
            start,
            end,
        });
    }
    let step = step.unwrap_or(1) as usize;
    Ok((start..=end).step_by(step).fold(0, |m, v| m | (1 << v)))
}

fn bad_token(spec: &FieldSpec, item: &str) -> CronError {
    CronError::BadToken {
        field: spec.name,
        token: item.to_string(),
    }
}

/// `None` if `text` is not all ASCII digits; `Some(Err)` if it overflows.
fn parse_digits(text: &str) -> Option<Result<u32, std::num::ParseIntError>> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse())
}

fn parse_value(spec: &FieldSpec, text: &str, item: &str) -> Result<u32, CronError> {
    let value = match parse_digits(text) {
        Some(Ok(v)) => v,
        Some(Err(_)) => u32::MAX, // too large for u32: certainly out of range
        None => {
            let pos = spec.names.iter().position(|n| n.eq_ignore_ascii_case(text));
            return pos
                .map(|p| p as u32 + spec.min)
                .ok_or_else(|| bad_token(spec, item));
        }
    };
    if value < spec.min || value > spec.max {
        return Err(CronError::OutOfRange {
            field: spec.name,
            value: text.to_string(),
            min: spec.min,
            max: spec.max,
        });
    }
    Ok(value)
}

/// 0 = Sunday; 1970-01-01 was a Thursday.
fn weekday(days: i64) -> u32 {
    (days + 4).rem_euclid(7) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix seconds of a UTC date and time.
    fn ts(y: i64, mo: u32, d: u32, h: i64, mi: i64) -> i64 {
        days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60
    }

    fn next(expr: &str, after: i64) -> Option<i64> {
        Schedule::parse(expr).unwrap().next_after(after)
    }

    #[track_caller]
    fn assert_next(expr: &str, after: i64, want: i64) {
        assert_eq!(next(expr, after), Some(want), "{expr:?} after {after}");
    }

    /// A time in December 2026; the 3rd is a Thursday.
    fn dec(d: u32, h: i64, mi: i64) -> i64 {
        ts(2026, 12, d, h, mi)
    }

    fn err(expr: &str) -> String {
        Schedule::parse(expr).unwrap_err().to_string()
    }

    #[test]
    fn helper_matches_known_timestamps() {
        assert_eq!(ts(1970, 1, 1, 0, 0), 0);
        assert_eq!(ts(1969, 12, 31, 0, 0), -86_400);
        assert_eq!(ts(2000, 3, 1, 0, 0), 951_868_800);
        assert_eq!(ts(2026, 12, 3, 0, 0), 1_796_256_000);
        assert_eq!(dec(4, 3, 0), 1_796_353_200);
        assert_eq!(ts(2028, 2, 29, 0, 0), 1_835_395_200);
        assert_eq!(weekday(0), 4); // Thursday
        assert_eq!(weekday(days_from_civil(2026, 12, 3)), 4);
    }

    #[test]
    fn civil_round_trip() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn daily_and_every_fifteen_minutes() {
        assert_next("0 3 * * *", dec(3, 9, 4), dec(4, 3, 0));
        assert_next("*/15 * * * *", dec(5, 10, 7), dec(5, 10, 15));
        assert_next("*/15 * * * *", dec(5, 10, 45), dec(5, 11, 0));
    }

    #[test]
    fn strictly_after_and_rounds_up_seconds() {
        let at = ts(2026, 6, 10, 3, 0);
        assert_next("0 3 * * *", at, ts(2026, 6, 11, 3, 0));
        assert_next("0 3 * * *", at - 1, at);
        assert_next("* * * * *", at + 59, at + 60);
        assert_next("* * * * *", -1, 0);
        assert_next("* * * * *", -61, -60);
    }

    #[test]
    fn leap_day() {
        assert_next("0 0 29 2 *", ts(2026, 3, 1, 0, 0), ts(2028, 2, 29, 0, 0));
    }

    #[test]
    fn weekdays() {
        let after = dec(3, 9, 4);
        assert_next("0 12 * * mon", after, dec(7, 12, 0));
        assert_next("0 12 * * MON", after, dec(7, 12, 0));
        assert_next("0 9 * * mon-fri", dec(4, 10, 0), dec(7, 9, 0));
        for sunday in ["0 0 * * 0", "0 0 * * 7", "0 0 * * Sun", "0 0 * * 0/7"] {
            assert_next(sunday, after, dec(6, 0, 0));
        }
        assert_next("0 0 * * 6-7", after, dec(5, 0, 0));
        assert_next("0 0 * * 6-7", dec(5, 0, 0), dec(6, 0, 0));
    }

    #[test]
    fn vixie_or_rule() {
        // 2026-11-13 and 2026-12-04 are Fridays; 2026-12-13 is a Sunday.
        let either = "0 0 13 * fri";
        assert_next(either, ts(2026, 11, 12, 0, 0), ts(2026, 11, 13, 0, 0));
        assert_next(either, dec(3, 0, 0), dec(4, 0, 0));
        assert_next(either, dec(11, 0, 0), dec(13, 0, 0));
        // With a `*` day-of-month both must match: only Fridays.
        assert_next("0 0 * * fri", dec(11, 0, 0), dec(18, 0, 0));
        // `*/2` still counts as unrestricted: odd days that are Mondays.
        assert_next("0 0 */2 * mon", dec(3, 0, 0), dec(7, 0, 0));
        assert_next("0 0 */2 * mon", dec(8, 0, 0), dec(21, 0, 0));
    }

    #[test]
    fn month_and_year_rollover() {
        assert_next("0 0 31 * *", ts(2026, 4, 15, 0, 0), ts(2026, 5, 31, 0, 0));
        assert_next(
            "30 23 * * *",
            ts(2026, 1, 31, 23, 45),
            ts(2026, 2, 1, 23, 30),
        );
        assert_next("0 0 * * *", ts(2027, 2, 28, 12, 0), ts(2027, 3, 1, 0, 0));
        assert_next("* * * * *", dec(31, 23, 59), ts(2027, 1, 1, 0, 0));
        assert_next("0 0 1 1 *", dec(31, 23, 59), ts(2027, 1, 1, 0, 0));
        assert_next(
            "0 0 1 jan-mar,DEC *",
            ts(2027, 3, 2, 0, 0),
            ts(2027, 12, 1, 0, 0),
        );
    }

    #[test]
    fn steps_and_lists() {
        let after = dec(3, 9, 4);
        assert_next("10/20 * * * *", after, dec(3, 9, 10));
        assert_next("10/20 * * * *", dec(3, 9, 51), dec(3, 10, 10));
        assert_next("0 8-18/5 * * *", after, dec(3, 13, 0));
        assert_next("0 8-18/5 * * *", dec(3, 18, 0), dec(4, 8, 0));
        assert_next("5,1,3 * * * *", after, dec(3, 9, 5));
        assert_next("*/100 * * * *", after, dec(3, 10, 0));
    }

    #[test]
    fn impossible_date_is_none_quickly() {
        let started = std::time::Instant::now();
        assert_eq!(next("0 0 30 2 *", ts(2026, 1, 1, 0, 0)), None);
        assert_eq!(next("0 0 31 4,6,9,11 *", ts(2026, 1, 1, 0, 0)), None);
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
    }

    #[test]
    fn extreme_timestamps_do_not_panic() {
        assert_eq!(next("* * * * *", i64::MAX), None);
        let near_max = i64::MAX - 86_400 * 800;
        let leap = next("0 0 29 2 *", near_max).unwrap();
        assert!(leap > near_max);
        assert_eq!(next("0 0 29 2 *", leap), None); // the next one overflows
        assert!(next("* * * * *", i64::MIN).is_some());
        assert!(next("0 0 30 2 *", i64::MIN).is_none());
    }

    #[test]
    fn aliases() {
        let after = dec(3, 9, 4);
        assert_next("@hourly", after, dec(3, 10, 0));
        assert_next("@daily", after, dec(4, 0, 0));
        assert_next("@MIDNIGHT", after, dec(4, 0, 0));
        assert_next("@weekly", after, dec(6, 0, 0));
        assert_next("@monthly", after, ts(2027, 1, 1, 0, 0));
        assert_next("@yearly", after, ts(2027, 1, 1, 0, 0));
        assert_next("@annually", ts(2027, 1, 1, 0, 0), ts(2028, 1, 1, 0, 0));
        assert!(err("@fortnightly").starts_with("unknown alias \"@fortnightly\""));
    }

    #[test]
    fn expr_display_and_from_str() {
        let s: Schedule = "  0 3 * * *\n".parse().unwrap();
        assert_eq!(s.expr(), "0 3 * * *");
        assert_eq!(s.to_string(), "0 3 * * *");
        assert_eq!(s, Schedule::parse("0 3 * * *").unwrap());
        assert_eq!(Schedule::parse(" @daily ").unwrap().to_string(), "@daily");
    }

    #[test]
    fn errors_name_the_field() {
        let fields = "expected 5 fields (minute hour day-of-month month day-of-week)";
        assert_eq!(err("1 2 3"), format!("{fields}, found 3"));
        assert_eq!(err(""), format!("{fields}, found 0"));
        for (expr, msg) in [
            ("0 24 * * *", "hour: 24 is out of range 0-23"),
            ("60 * * * *", "minute: 60 is out of range 0-59"),
            ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
            ("0 0 * 13 *", "month: 13 is out of range 1-12"),
            ("0 0 * * 8", "day-of-week: 8 is out of range 0-7"),
            ("0 0 * * fri-", "day-of-week: cannot parse \"fri-\""),
            ("0 0 * * monday", "day-of-week: cannot parse \"monday\""),
            ("*/0 * * * *", "minute: step must be at least 1 in \"*/0\""),
            ("5-1 * * * *", "minute: range 5-1 is reversed"),
            ("0 0 * dec-jan *", "month: range 12-1 is reversed"),
            (
                "1 2 3 4 99999999999999999999",
                "day-of-week: 99999999999999999999 is out of range 0-7",
            ),
        ] {
            assert_eq!(err(expr), msg);
        }
    }

    #[test]
    fn odd_inputs_are_rejected_without_panicking() {
        let odd = "|@|*|a b c d e|1-|-1 * * * *|1- * * * *|1,,2 * * * *|*/ * * * *|/5 * * * *\
            |1/2/3 * * * *|*/99999999999999999999 * * * *|** * * * *|*-5 * * * *|0 0 * * sun-\
            |ö * * * *|0 0 * * fré|0 0 * * ☃|１ * * * *|0 0 1 * * extra|-0 * * * *|+1 * * * *\
            |0x1 * * * *|1.5 * * * *|0 0 * * *x";
        for input in odd.split('|') {
            assert!(
                Schedule::parse(input).is_err(),
                "{input:?} should be rejected"
            );
        }
        // Unicode whitespace separates fields like ASCII whitespace does.
        assert!(Schedule::parse("0\u{3000}0 * * *").is_ok());
    }
}
