//! PostgreSQL's and ISO 8601's interval texts: `INTERVAL '1 day 02:00:00'`, `'04:05:06'::interval`,
//! `'-1 day -02:03:04.5'`, `'1 mon 2 days 03:04:05 ago'`, `'P1Y2M3DT4H5M6S'`.
//!
//! Why: DataFusion reads only `<number> <unit>` pairs (`1 day 2 hours`) and refused these, which
//! is how PostgreSQL writes intervals (and how the PostgreSQL endpoint writes them back), how
//! psycopg sends a `timedelta` (`1 day 2:00:00`), and how ISO 8601 writes durations.
//!
//! How: [`as_units`] writes such a text as the pairs DataFusion reads (`1 day 2 hours 0 minutes
//! 0 seconds`); [`interval_literals`], a pass over the parsed statement, applies it to the text of
//! every `INTERVAL '...'` literal and every cast of a string literal to `INTERVAL`. A text in
//! neither form is left to DataFusion, whose error then names it.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{DataType, Expr, Value, VisitorMut};

/// `text` as `<number> <unit>` pairs, when it is written in PostgreSQL's form with a clock part
/// (`[+-]H:MM[:SS[.f]]`), or with `@` or `ago`, or in ISO 8601's (`P...`); `None` otherwise.
pub fn as_units(text: &str) -> Option<String> {
    let trimmed = text.trim();
    if let Some(iso) = trimmed.strip_prefix(['P', 'p']) {
        return iso_units(iso);
    }
    let mut words: Vec<&str> = trimmed.split_whitespace().collect();
    let at = words.first() == Some(&"@");
    if at {
        words.remove(0);
    }
    let ago = words.last().is_some_and(|w| w.eq_ignore_ascii_case("ago"));
    if ago {
        words.pop();
    }
    let clock = words.iter().any(|w| w.contains(':'));
    if !(clock || at || ago) {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let word = words[i];
        if word.contains(':') {
            out.extend(clock_units(word)?);
            i += 1;
            continue;
        }
        // `<number> <unit>`, or `<number><unit>` in one word.
        let split = word.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(word.len());
        let (number, unit) = match split < word.len() {
            true => (&word[..split], &word[split..]),
            false => {
                let unit = words.get(i + 1)?;
                i += 1;
                (word, *unit)
            }
        };
        number.parse::<f64>().ok()?;
        out.push(format!("{number} {unit}"));
        i += 1;
    }
    if ago {
        out = out.into_iter().map(|pair| negated(&pair)).collect();
    }
    (!out.is_empty()).then(|| out.join(" "))
}

/// `[+-]H:MM[:SS[.f]]` as hours, minutes and seconds, each with the clock's sign.
fn clock_units(word: &str) -> Option<Vec<String>> {
    let (sign, clock) = match word.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", word.strip_prefix('+').unwrap_or(word)),
    };
    let fields: Vec<&str> = clock.split(':').collect();
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (hours, minutes, seconds) = match fields.as_slice() {
        [h, m] => (*h, *m, "0"),
        [h, m, s] => (*h, *m, *s),
        _ => return None,
    };
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    if !digits(hours) || !digits(minutes) || !digits(whole) || !(fraction.is_empty() || digits(fraction)) {
        return None;
    }
    Some(vec![format!("{sign}{hours} hours"), format!("{sign}{minutes} minutes"), format!("{sign}{seconds} seconds")])
}

/// `<number> <unit>` with the number's sign flipped (for `ago`).
fn negated(pair: &str) -> String {
    match pair.strip_prefix('-') {
        Some(rest) => rest.to_string(),
        None => format!("-{}", pair.strip_prefix('+').unwrap_or(pair)),
    }
}

/// ISO 8601's `nYnMnWnDTnHnMnS` (after the `P`) as `<number> <unit>` pairs.
fn iso_units(iso: &str) -> Option<String> {
    let (date, time) = match iso.split_once(['T', 't']) {
        Some((date, time)) => (date, Some(time)),
        None => (iso, None),
    };
    let mut out = Vec::new();
    let mut take = |part: &str, units: &[(char, &str)]| -> Option<()> {
        let mut number = String::new();
        for c in part.chars() {
            if c.is_ascii_digit() || c == '.' || c == '-' {
                number.push(c);
                continue;
            }
            let unit = units.iter().find(|(letter, _)| letter.eq_ignore_ascii_case(&c))?.1;
            number.parse::<f64>().ok()?;
            out.push(format!("{number} {unit}"));
            number.clear();
        }
        number.is_empty().then_some(())
    };
    take(date, &[('Y', "years"), ('M', "months"), ('W', "weeks"), ('D', "days")])?;
    if let Some(time) = time {
        take(time, &[('H', "hours"), ('M', "minutes"), ('S', "seconds")])?;
    }
    (!out.is_empty()).then(|| out.join(" "))
}

/// Rewrites the text of every interval literal in `statement` that [`as_units`] reads.
pub fn interval_literals(statement: &mut DfStatement) {
    crate::repeated_items::visit_statement_mut(statement, &mut IntervalLiterals);
}

struct IntervalLiterals;

impl VisitorMut for IntervalLiterals {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let value = match expr {
            Expr::Interval(interval) if interval.leading_field.is_none() && interval.last_field.is_none() => {
                interval.value.as_mut()
            }
            Expr::Cast { expr: value, data_type: DataType::Interval { .. }, .. } => value.as_mut(),
            _ => return ControlFlow::Continue(()),
        };
        if let Expr::Value(v) = value
            && let Value::SingleQuotedString(text) = &mut v.value
            && let Some(units) = as_units(text)
        {
            *text = units;
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    #[test]
    fn postgresql_and_iso_texts_become_unit_pairs() {
        for (text, want) in [
            ("1 day 02:00:00", Some("1 day 02 hours 00 minutes 00 seconds")),
            ("04:05:06", Some("04 hours 05 minutes 06 seconds")),
            ("1 day 2:00:00", Some("1 day 2 hours 00 minutes 00 seconds")),
            ("-1 day -02:03:04.5", Some("-1 day -02 hours -03 minutes -04.5 seconds")),
            ("1 mon 2 days 03:04", Some("1 mon 2 days 03 hours 04 minutes 0 seconds")),
            ("@ 1 day 2 hours ago", Some("-1 day -2 hours")),
            ("3 days ago", Some("-3 days")),
            ("P1Y2M3DT4H5M6.5S", Some("1 years 2 months 3 days 4 hours 5 minutes 6.5 seconds")),
            ("PT36H", Some("36 hours")),
            ("P2W", Some("2 weeks")),
            ("1 day", None),
            ("2 hours 3 minutes", None),
            ("1 day 25:61:xx", None),
            ("P1X", None),
        ] {
            assert_eq!(as_units(text).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn literals_and_casts_are_rewritten() {
        let sql = "SELECT INTERVAL '1 day 02:00:00', '04:05:06'::interval, CAST('P1D' AS INTERVAL), \
                   INTERVAL '1' DAY, '04:05'::text";
        let mut statement = DFParser::parse_sql(sql).expect("parse").pop_front().expect("statement");
        interval_literals(&mut statement);
        let text = statement.to_string();
        assert!(text.contains("INTERVAL '1 day 02 hours 00 minutes 00 seconds'"), "{text}");
        assert!(text.contains("'04 hours 05 minutes 06 seconds'::INTERVAL"), "{text}");
        assert!(text.contains("CAST('1 days' AS INTERVAL)"), "{text}");
        assert!(text.contains("INTERVAL '1' DAY") && text.contains("'04:05'::TEXT"), "{text}");
    }
}
