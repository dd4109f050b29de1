//! The three `SERVICEBUS_SEND_*` capacity variables follow the contract's forgiving rules
//! (section 2) because deployed fleets already set them by hand: they never stop start-up.

/// `SERVICEBUS_SEND_FAILCLOSED`: `1`, `true` or `yes` in any case turn it on; anything else is off.
pub fn forgiving_flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        let v = v.trim();
        v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
    })
}

/// `SERVICEBUS_SEND_FAILCLOSED_STREAK`: default 3, below 1 becomes 1, a non-integer means 3
/// (an integer too large to hold is still an integer: it becomes the largest streak).
pub fn forgiving_streak(value: Option<&str>) -> u32 {
    match value.map(|v| v.trim().parse::<i128>()) {
        Some(Ok(n)) => n.clamp(1, i128::from(u32::MAX)) as u32,
        _ => 3,
    }
}

/// `SERVICEBUS_SEND_MAX_QUEUE_DEPTH`: default 2000, below 1 becomes 1, a non-integer means 2000.
pub fn forgiving_max_depth(value: Option<&str>) -> u64 {
    match value.map(|v| v.trim().parse::<i128>()) {
        Some(Ok(n)) => n.clamp(1, i128::from(u64::MAX)) as u64,
        _ => 2000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failclosed_flag_accepts_exactly_1_true_yes_in_any_case() {
        for on in ["1", "true", "TRUE", "yes", "Yes", " true "] {
            assert!(forgiving_flag(Some(on)), "{on:?}");
        }
        for off in ["0", "false", "on", "y", "2", "", "enabled"] {
            assert!(!forgiving_flag(Some(off)), "{off:?}");
        }
        assert!(!forgiving_flag(None));
    }

    #[test]
    fn streak_below_one_is_one_and_garbage_is_three() {
        assert_eq!(forgiving_streak(Some("0")), 1);
        assert_eq!(forgiving_streak(Some("-4")), 1);
        assert_eq!(forgiving_streak(Some("5")), 5);
        assert_eq!(forgiving_streak(Some("abc")), 3);
        assert_eq!(forgiving_streak(Some("2.5")), 3);
        assert_eq!(forgiving_streak(None), 3);
        assert_eq!(forgiving_streak(Some("99999999999999999999")), u32::MAX);
    }

    #[test]
    fn max_depth_below_one_is_one() {
        assert_eq!(forgiving_max_depth(Some("0")), 1);
        assert_eq!(forgiving_max_depth(Some("-10")), 1);
        assert_eq!(forgiving_max_depth(Some("50")), 50);
        assert_eq!(forgiving_max_depth(Some("lots")), 2000);
        assert_eq!(
            forgiving_max_depth(Some("99999999999999999999999")),
            u64::MAX
        );
    }
}
