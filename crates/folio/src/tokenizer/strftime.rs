//! `strftime` for the chat templates' `strftime_now(format)` (transformers passes the
//! current date to templates that print it: Llama 3.2, Mistral Small 3): the C/Python
//! directives those templates use, in UTC and the C locale. An unknown directive is an
//! error naming it, not a guess.

/// The proleptic Gregorian date of a day counted from 1970-01-01: (year, month 1-12,
/// day 1-31).
fn civil(days: i64) -> (i64, u32, u32) {
    // Eras of 400 years (146,097 days) starting on March 1st, so the leap day is last.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` with its directives replaced by the UTC time `epoch_seconds`.
pub fn format(format: &str, epoch_seconds: i64) -> Result<String, String> {
    let days = epoch_seconds.div_euclid(86_400);
    let secs = epoch_seconds.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let wd = (days + 3).rem_euclid(7) as usize;
    const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUMULATIVE[m as usize - 1] + d + u32::from(m > 2 && is_leap(y));
    let month = MONTHS[m as usize - 1];
    let weekday = WEEKDAYS[wd];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(k) = chars.next() else {
            return Err("the format ends in a lone %".into());
        };
        match k {
            'Y' => out.push_str(&y.to_string()),
            'y' => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            'm' => out.push_str(&format!("{m:02}")),
            'd' => out.push_str(&format!("{d:02}")),
            'e' => out.push_str(&format!("{d:2}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'H' => out.push_str(&format!("{hh:02}")),
            'I' => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            'p' => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{mm:02}")),
            'S' => out.push_str(&format!("{ss:02}")),
            'b' | 'h' => out.push_str(&month[..3]),
            'B' => out.push_str(month),
            'a' => out.push_str(&weekday[..3]),
            'A' => out.push_str(weekday),
            'u' => out.push_str(&(wd + 1).to_string()),
            'w' => out.push_str(&((wd + 1) % 7).to_string()),
            'F' => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            'T' => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            'D' => out.push_str(&format!("{m:02}/{d:02}/{:02}", y.rem_euclid(100))),
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            '%' => out.push('%'),
            other => return Err(format!("the directive %{other} is not supported")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_as_python_strftime_does() {
        // 2025-01-15 10:20:30 UTC, a Wednesday; 2024-02-29 (leap), 1969-12-31.
        assert_eq!(
            format(
                "%d %b %Y|%Y-%m-%d|%A %a %B %j %H:%M:%S %I%p %%",
                1_736_936_430
            )
            .unwrap(),
            "15 Jan 2025|2025-01-15|Wednesday Wed January 015 10:20:30 10AM %"
        );
        assert_eq!(
            format("%F %j %a", 1_709_164_800).unwrap(),
            "2024-02-29 060 Thu"
        );
        assert_eq!(format("%F %T %a", -1).unwrap(), "1969-12-31 23:59:59 Wed");
        assert_eq!(format("%F %j", 1_735_603_200).unwrap(), "2024-12-31 366");
        assert!(format("%Q", 0).is_err());
        assert!(format("%", 0).is_err());
    }

    #[test]
    fn every_day_of_four_centuries_follows_the_previous() {
        let mut prev = civil(-1);
        for days in 0..146_097 {
            let (y, m, d) = civil(days);
            let next_day = (prev.0, prev.1, prev.2 + 1) == (y, m, d);
            let next_month =
                d == 1 && ((prev.0, prev.1 + 1) == (y, m) || (prev.0 + 1, 12) == (y, prev.1));
            assert!(next_day || next_month, "{prev:?} then {:?}", (y, m, d));
            prev = (y, m, d);
        }
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
    }
}
