//! The daemon's nightly schedule: a classic five-field cron expression (`minute hour
//! day-of-month month day-of-week`, names such as `mon` and `jan`, `*/n` steps, the `@daily`
//! family) read in an IANA time zone (`schedule_tz`, default UTC).
//!
//! Parsing and the search for the next time are `croner`'s; the zone rules are `chrono-tz`'s
//! (the IANA database compiled in, so a node without `/usr/share/zoneinfo` schedules the same).
//! Wall-clock times follow the zone across daylight saving: "0 3 * * *" in `Europe/Berlin` is
//! 03:00 Berlin time in winter and in summer. A fixed time (one minute of one hour) that the
//! spring change skips fires right after the gap; the times of an interval pattern (`*/30 2 * *
//! *`) inside the gap do not exist and are skipped. A wall-clock time the autumn change repeats
//! fires once, at its first pass, for every pattern.
//!
//! When day-of-month and day-of-week are both restricted, a day matching either one fires, as in
//! Vixie cron; unlike Vixie cron, croner counts only a bare `*` as unrestricted, so a stepped
//! day-of-month (`*/2`) with a weekday means "either".

use std::fmt;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// Why a schedule was rejected.
#[derive(Debug, thiserror::Error)]
pub enum CronError {
    #[error("{expr:?}: {reason}")]
    Expression { expr: String, reason: String },
    #[error("unknown time zone {0:?} (an IANA name such as \"Europe/Berlin\", or \"UTC\")")]
    TimeZone(String),
}

/// A parsed cron schedule in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    expr: String,
    tz: Tz,
    cron: Cron,
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.expr == other.expr && self.tz == other.tz
    }
}

/// The most past answers croner can give before a future one: the minutes of a repeated hour.
const MAX_PAST_ANSWERS: usize = 61;

impl Schedule {
    /// Parses a five-field cron expression or an `@alias`, to be read in the IANA zone `tz`.
    pub fn parse(expr: &str, tz: &str) -> Result<Schedule, CronError> {
        let trimmed = expr.trim();
        let zone: Tz = tz
            .trim()
            .parse()
            .map_err(|_| CronError::TimeZone(tz.to_owned()))?;
        let bad = |reason: String| CronError::Expression {
            expr: trimmed.to_owned(),
            reason,
        };
        let fields = trimmed.split_whitespace().count();
        if !trimmed.starts_with('@') && fields != 5 {
            return Err(bad(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {fields}"
            )));
        }
        // croner knows the other aliases; `@midnight` is Vixie cron's name for `@daily`.
        let body = if trimmed.eq_ignore_ascii_case("@midnight") {
            "@daily"
        } else {
            trimmed
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(body)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Schedule {
            expr: trimmed.to_owned(),
            tz: zone,
            cron,
        })
    }

    /// The expression, trimmed.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone's IANA name.
    pub fn tz(&self) -> &'static str {
        self.tz.name()
    }

    /// What identifies the schedule for the stored plan: the expression, and the zone unless
    /// it is UTC (so a plan stored before zones existed still counts).
    pub fn key(&self) -> String {
        if self.tz == Tz::UTC {
            self.expr.clone()
        } else {
            format!("{} {}", self.expr, self.tz.name())
        }
    }

    /// The first matching minute strictly after `unix_secs`, as Unix seconds, or `None` when
    /// none comes within croner's search horizon (an impossible date such as 30 February) or
    /// the time is outside the calendar's range.
    pub fn next_after(&self, unix_secs: i64) -> Option<i64> {
        let now: DateTime<Tz> = Utc
            .timestamp_opt(unix_secs, 0)
            .single()?
            .with_timezone(&self.tz);
        let mut from = now;
        // croner searches wall-clock time and answers a time the autumn change repeats with its
        // first pass. Asked from inside the second pass, that answer is already past: each
        // wall-clock time fires once, so the search moves on past it. Every pass moves `from`
        // to a later wall-clock minute; a repeated hour holds at most 60 of them.
        for _ in 0..=MAX_PAST_ANSWERS {
            let next = self.cron.find_next_occurrence(&from, false).ok()?;
            if next.timestamp() > unix_secs {
                return Some(next.timestamp());
            }
            from = next;
        }
        None
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.expr, self.tz.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix seconds of a UTC date and time.
    fn ts(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .unwrap()
            .timestamp()
    }

    /// Unix seconds of a wall-clock time in `tz` (the earlier one when it is ambiguous).
    fn local(tz: &str, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        let tz: Tz = tz.parse().unwrap();
        tz.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp()
    }

    fn next(expr: &str, after: i64) -> Option<i64> {
        Schedule::parse(expr, "UTC").unwrap().next_after(after)
    }

    #[track_caller]
    fn assert_next(expr: &str, after: i64, want: i64) {
        assert_eq!(next(expr, after), Some(want), "{expr:?} after {after}");
    }

    /// A time in December 2026; the 3rd is a Thursday.
    fn dec(d: u32, h: u32, mi: u32) -> i64 {
        ts(2026, 12, d, h, mi)
    }

    fn err(expr: &str) -> String {
        Schedule::parse(expr, "UTC").unwrap_err().to_string()
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
        for sunday in ["0 0 * * 0", "0 0 * * 7", "0 0 * * Sun"] {
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
        // With a `*` day-of-month only the weekday counts.
        assert_next("0 0 * * fri", dec(11, 0, 0), dec(18, 0, 0));
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
    }

    #[test]
    fn impossible_date_is_none_quickly() {
        let started = std::time::Instant::now();
        assert_eq!(next("0 0 30 2 *", ts(2026, 1, 1, 0, 0)), None);
        assert_eq!(next("0 0 31 4,6,9,11 *", ts(2026, 1, 1, 0, 0)), None);
        // Generous: croner gives up after a bounded search; this only guards against a hang.
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn extreme_timestamps_do_not_panic() {
        assert_eq!(next("* * * * *", i64::MAX), None);
        assert_eq!(next("* * * * *", i64::MIN), None);
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
        assert!(Schedule::parse("@fortnightly", "UTC").is_err());
    }

    #[test]
    fn expr_zone_and_key() {
        let s = Schedule::parse("  0 3 * * *\n", " UTC").unwrap();
        assert_eq!(s.expr(), "0 3 * * *");
        assert_eq!(s.tz(), "UTC");
        assert_eq!(s.key(), "0 3 * * *");
        assert_eq!(s.to_string(), "0 3 * * * (UTC)");
        let b = Schedule::parse("0 3 * * *", "Europe/Berlin").unwrap();
        assert_eq!(b.key(), "0 3 * * * Europe/Berlin");
        assert_ne!(s, b);
    }

    /// The reason an operator sets a zone: "3 am" stays 3 am local across daylight saving,
    /// where a UTC schedule moves by an hour twice a year.
    #[test]
    fn a_zone_keeps_the_local_hour_across_daylight_saving() {
        let berlin = Schedule::parse("0 3 * * *", "Europe/Berlin").unwrap();
        // Winter (CET, UTC+1): 03:00 local is 02:00 UTC.
        assert_eq!(
            berlin.next_after(ts(2027, 1, 10, 12, 0)),
            Some(ts(2027, 1, 11, 2, 0))
        );
        // Summer (CEST, UTC+2): 01:00 UTC.
        assert_eq!(
            berlin.next_after(ts(2027, 7, 10, 12, 0)),
            Some(ts(2027, 7, 11, 1, 0))
        );
        // Over the spring change (2027-03-28, 02:00 -> 03:00): every night once, at 03:00.
        let mut t = local("Europe/Berlin", 2027, 3, 26, 12, 0);
        let mut fired = Vec::new();
        for _ in 0..4 {
            t = berlin.next_after(t).unwrap();
            fired.push(t);
        }
        assert_eq!(
            fired,
            (27..=30)
                .map(|d| local("Europe/Berlin", 2027, 3, d, 3, 0))
                .collect::<Vec<_>>()
        );
        let ny = Schedule::parse("30 1 * * *", "America/New_York").unwrap();
        assert_eq!(
            ny.next_after(ts(2027, 1, 10, 12, 0)),
            Some(ts(2027, 1, 11, 6, 30))
        );
    }

    #[test]
    fn a_skipped_time_fires_after_the_gap_and_a_repeated_one_once() {
        let s = Schedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
        // 2027-03-28 has no 02:30 in Berlin: it fires at 03:00 CEST (01:00 UTC), then on
        // the 29th at 02:30 CEST.
        let first = s
            .next_after(local("Europe/Berlin", 2027, 3, 27, 12, 0))
            .unwrap();
        assert_eq!(first, ts(2027, 3, 28, 1, 0));
        assert_eq!(s.next_after(first), Some(ts(2027, 3, 29, 0, 30)));
        // 2027-10-31 has 02:30 twice (CEST, then CET): it fires at the first only.
        let first = s
            .next_after(local("Europe/Berlin", 2027, 10, 30, 12, 0))
            .unwrap();
        assert_eq!(first, ts(2027, 10, 31, 0, 30));
        assert_eq!(s.next_after(first), Some(ts(2027, 11, 1, 1, 30)));
        // Also when the scheduler asks a little later, inside the repeated hour.
        assert_eq!(s.next_after(first + 1800), Some(ts(2027, 11, 1, 1, 30)));
    }

    /// An interval pattern asked from inside the repeated autumn hour (02:05 CET, its second
    /// pass): croner's answers 02:10 … 02:50 are the first pass, all past; the next time is the
    /// first one after the hour, never none.
    #[test]
    fn an_interval_schedule_asked_inside_the_repeated_hour_fires_after_it() {
        let s = Schedule::parse("*/10 * * * *", "Europe/Berlin").unwrap();
        let second_pass = ts(2027, 10, 31, 1, 5); // 02:05 CET
        assert_eq!(s.next_after(second_pass), Some(ts(2027, 10, 31, 2, 0)));
        // Every minute: up to 55 past answers in a row before 03:00 CET.
        let every = Schedule::parse("* * * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            every.next_after(ts(2027, 10, 31, 1, 4)),
            Some(ts(2027, 10, 31, 2, 0))
        );
        // In the first pass, times come minute by minute as usual.
        assert_eq!(
            s.next_after(ts(2027, 10, 31, 0, 5)),
            Some(ts(2027, 10, 31, 0, 10))
        );
        // A spring gap: the times of an interval pattern inside it do not exist.
        let gap = Schedule::parse("*/30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            gap.next_after(local("Europe/Berlin", 2027, 3, 28, 1, 45)),
            Some(local("Europe/Berlin", 2027, 3, 29, 2, 0))
        );
    }

    #[test]
    fn errors_name_the_expression_or_the_zone() {
        let fields = "expected 5 fields (minute hour day-of-month month day-of-week)";
        assert_eq!(err("1 2 3"), format!("\"1 2 3\": {fields}, found 3"));
        assert_eq!(err(""), format!("\"\": {fields}, found 0"));
        assert_eq!(
            err("0 0 1 * * 2027"),
            format!("\"0 0 1 * * 2027\": {fields}, found 6")
        );
        for bad in [
            "0 24 * * *",
            "60 * * * *",
            "0 0 0 * *",
            "0 0 * 13 *",
            "0 0 * * 8",
        ] {
            let e = err(bad);
            assert!(e.starts_with(&format!("{bad:?}: ")), "{e}");
        }
        let e = Schedule::parse("0 3 * * *", "Europe/Berln").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown time zone \"Europe/Berln\" (an IANA name such as \"Europe/Berlin\", or \"UTC\")"
        );
    }

    #[test]
    fn odd_inputs_are_rejected_without_panicking() {
        let odd = "|@|*|a b c d e|1-|-1 * * * *|1- * * * *|*/ * * * *|/5 * * * *\
            |1/2/3 * * * *|*/99999999999999999999 * * * *|** * * * *|*-5 * * * *|0 0 * * sun-\
            |ö * * * *|0 0 * * fré|0 0 * * ☃|１ * * * *|0 0 1 * * extra|+1 * * * *\
            |0x1 * * * *|1.5 * * * *|0 0 * * *x|*/0 * * * *|5-1 * * * *";
        for input in odd.split('|') {
            assert!(
                Schedule::parse(input, "UTC").is_err(),
                "{input:?} should be rejected"
            );
        }
    }
}
