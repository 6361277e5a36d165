//! Cron schedules (`lambdastore.schedule`): when a schedule's ticks are
//! due, and what a tick found late does. A pattern is standard cron, 5
//! fields (minute to day of week), or 6 with seconds first; it is read in
//! an IANA time zone, so that "0 9 * * *" stays at nine across daylight
//! saving changes.

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};

/// What a tick does when it is found late: when its schedule's next tick
/// is due as well (no worker ran while it was due: the server was down,
/// or the workers were busy for a whole period).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// It runs, once, however many ticks were missed.
    RunOnce,
    /// It does not run.
    Skip,
}

impl Missed {
    pub fn parse(text: &str) -> Result<Missed, String> {
        match text {
            "run_once" => Ok(Missed::RunOnce),
            "skip" => Ok(Missed::Skip),
            other => Err(format!("missed is 'run_once' or 'skip', not {other:?}")),
        }
    }
}

/// The longest pattern taken: a standard one is a few dozen bytes, and a
/// pattern is stored and shown in `app_schedules` (one of 200 kB was).
pub const MAX_PATTERN: usize = 1_000;

/// A parsed pattern in its time zone.
#[derive(Debug)]
pub struct Schedule {
    cron: Cron,
    zone: Tz,
}

/// What becomes of a tick due at some time, claimed now.
#[derive(Debug, PartialEq, Eq)]
pub struct Tick {
    /// Whether it runs (a late tick under `Missed::Skip` does not).
    pub runs: bool,
    /// When the next tick is due (µs since the Unix epoch); None: never.
    pub next_micros: Option<i64>,
}

impl Schedule {
    /// `pattern` in the IANA time zone `zone` ("UTC", "Europe/Paris"). A
    /// year field, which croner takes by default, is refused: a schedule
    /// past its last year stayed, due never, its name taken.
    pub fn parse(pattern: &str, zone: &str) -> Result<Schedule, String> {
        if pattern.len() > MAX_PATTERN {
            return Err(format!("a cron pattern is at most {MAX_PATTERN} bytes, not {}", pattern.len()));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(pattern)
            .map_err(|e| format!("cron pattern {pattern:?}: {e}"))?;
        let zone = zone.parse::<Tz>().map_err(|_| format!("unknown time zone {zone:?}"))?;
        Ok(Schedule { cron, zone })
    }

    /// The first time after `micros` (µs since the Unix epoch) that the
    /// pattern matches; None if none comes (a date that never exists).
    pub fn next_after(&self, micros: i64) -> Option<i64> {
        let after = self.zone.from_utc_datetime(&DateTime::<Utc>::from_timestamp_micros(micros)?.naive_utc());
        let next = self.cron.find_next_occurrence(&after, false).ok()?;
        Some(next.with_timezone(&Utc).timestamp_micros())
    }

    /// The tick due at `due_micros`, claimed at `now_micros`: late if the
    /// tick after it is due too. An on-time tick's next is the one after
    /// it; after a late one the schedule resumes with the first tick after
    /// now (the ones between are not run).
    pub fn tick(&self, due_micros: i64, now_micros: i64, missed: Missed) -> Tick {
        let following = self.next_after(due_micros);
        let late = following.is_some_and(|next| next <= now_micros);
        if !late {
            return Tick { runs: true, next_micros: following };
        }
        Tick { runs: missed == Missed::RunOnce, next_micros: self.next_after(now_micros) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: i64 = 1_000_000;
    /// 2026-01-01 00:00:00 UTC.
    const NEW_YEAR: i64 = 1_767_225_600 * SECOND;

    #[test]
    fn five_fields_are_minutes_and_six_start_with_seconds() {
        let minutely = Schedule::parse("* * * * *", "UTC").unwrap();
        assert_eq!(minutely.next_after(NEW_YEAR), Some(NEW_YEAR + 60 * SECOND));
        let every_second = Schedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(every_second.next_after(NEW_YEAR + SECOND / 2), Some(NEW_YEAR + SECOND));
    }

    #[test]
    fn a_year_field_and_an_endless_pattern_are_refused() {
        let year = Schedule::parse("0 7 8 1 12 * 2026", "UTC").unwrap_err();
        assert!(year.contains("cron pattern"), "{year}");
        let long = format!("{}1 * * * *", "1,".repeat(MAX_PATTERN));
        let refused = Schedule::parse(&long, "UTC").unwrap_err();
        assert!(refused.contains("at most 1000 bytes"), "{refused}");
    }

    #[test]
    fn a_pattern_is_read_in_its_time_zone() {
        let nine = Schedule::parse("0 9 * * *", "Europe/Paris").unwrap();
        // 09:00 in Paris on 1 January is 08:00 UTC (winter time).
        assert_eq!(nine.next_after(NEW_YEAR), Some(NEW_YEAR + 8 * 3600 * SECOND));
    }

    #[test]
    fn bad_patterns_and_zones_are_refused() {
        assert!(Schedule::parse("61 * * * *", "UTC").is_err());
        assert!(Schedule::parse("not cron", "UTC").is_err());
        assert!(Schedule::parse("* * * * *", "Mars/Olympus").is_err());
        assert!(Missed::parse("sometimes").is_err());
    }

    #[test]
    fn an_on_time_tick_runs_and_its_next_follows_it() {
        let every_second = Schedule::parse("* * * * * *", "UTC").unwrap();
        let tick = every_second.tick(NEW_YEAR, NEW_YEAR + SECOND / 10, Missed::Skip);
        assert_eq!(tick, Tick { runs: true, next_micros: Some(NEW_YEAR + SECOND) });
    }

    #[test]
    fn a_late_tick_runs_once_or_is_skipped_and_the_schedule_resumes_after_now() {
        let every_second = Schedule::parse("* * * * * *", "UTC").unwrap();
        let now = NEW_YEAR + 5 * SECOND + SECOND / 2;
        let resumes = Some(NEW_YEAR + 6 * SECOND);
        assert_eq!(every_second.tick(NEW_YEAR, now, Missed::RunOnce), Tick { runs: true, next_micros: resumes });
        assert_eq!(every_second.tick(NEW_YEAR, now, Missed::Skip), Tick { runs: false, next_micros: resumes });
    }
}
