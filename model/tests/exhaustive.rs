//! Every rule on: the checker visits every reachable state of each configuration and finds
//! the invariant holding in all of them, and reaches what the configuration's faults lead
//! to in some. Run with `--nocapture` for the state counts and times.
mod common;

use sendgate_model::{configs, reached};

#[test]
fn fail_closed_holds_the_ceiling_through_a_restart_a_partition_late_replies_a_crash_and_a_pause() {
    common::holds(
        "fail_closed",
        configs::fail_closed(),
        &[
            reached::NEW_EPOCH_GRANTS,
            reached::CARRY,
            reached::CRASHED_IN_FLIGHT,
            reached::LATE_REPLY,
            reached::CUT_OFF_WITH_UNIT,
            reached::LEFT,
        ],
    );
}

#[test]
fn fail_open_holds_l_plus_one_share_per_replica_cut_off() {
    common::holds(
        "fail_open",
        configs::fail_open(),
        &[reached::ALONE, reached::PAST_L, reached::CUT_OFF_WITH_UNIT],
    );
}

#[test]
fn a_failover_to_a_copy_that_missed_writes_holds_the_ceiling_when_the_incarnation_is_checked() {
    common::holds(
        "failover",
        configs::failover(),
        &[
            reached::FAILED_OVER,
            reached::NEW_EPOCH_GRANTS,
            reached::CARRY,
            reached::LATE_REPLY,
        ],
    );
}

#[test]
fn a_drained_message_and_its_replacement_hold_the_ceiling_with_a_crash_or_a_pause() {
    common::holds(
        "drain",
        configs::drain(),
        &[
            reached::DRAINED,
            reached::CRASHED_IN_FLIGHT,
            reached::LATE_REPLY,
        ],
    );
}

#[test]
fn the_whole_fleet_cut_off_holds_the_ceiling_when_each_part_is_rounded_down() {
    common::holds("whole_fleet", configs::whole_fleet(), &[reached::ALONE]);
}

#[test]
fn three_replicas_hold_the_ceiling_with_a_drain_a_crash_and_a_pause() {
    common::holds(
        "three",
        configs::three(),
        &[
            reached::DRAINED,
            reached::CRASHED_IN_FLIGHT,
            reached::LATE_REPLY,
        ],
    );
}

#[test]
fn a_batch_beside_a_send_holds_the_ceiling_all_or_nothing_through_a_restart_a_pause_and_a_crash() {
    common::holds(
        "batch",
        configs::batch(),
        &[
            reached::BATCH,
            reached::SHORT_GRANT,
            reached::NEW_EPOCH_GRANTS,
            reached::CARRY,
            reached::CRASHED_IN_FLIGHT,
            reached::LATE_REPLY,
            reached::LEFT,
        ],
    );
}
