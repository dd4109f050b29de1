//! Each rule switched off, in a configuration where it should matter: the checker finds a
//! run past the ceiling (the shortest, breadth first), and the test's name says which hole
//! the rule closes. Run with `--nocapture` to read each run in words.
//!
//! Two rules close the same hole (a grant used after its lease): either suffices, so each
//! alone switched off still holds, and both switched off do not. Four tests are the flaws
//! this model found in docs/fleet.md itself: the rule as the text has it fails, the fix
//! (the model's rule, `Rules::ALL`) holds in the exhaustive checks (tests/exhaustive.rs).
mod common;

use sendgate_model::configs;

fn hole(name: &str) {
    let cfg = configs::by_name(name).unwrap();
    assert!(
        common::counterexample(name, cfg).is_some(),
        "{name}: no run past the ceiling"
    );
}

fn no_hole(name: &str) {
    let cfg = configs::by_name(name).unwrap();
    assert!(common::counterexample(name, cfg).is_none());
}

#[test]
fn without_the_epoch_a_redis_restart_admits_past_the_ceiling() {
    hole("no_epoch");
}

#[test]
fn a_late_grant_is_harmless_while_its_use_window_counts_from_the_ask() {
    no_hole("no_late_release");
}

#[test]
fn a_use_window_counted_from_the_reply_is_harmless_while_late_grants_are_released() {
    no_hole("no_use_until_from_ask");
}

#[test]
fn a_late_grant_used_with_a_fresh_use_window_admits_past_the_ceiling() {
    hole("no_late_release_nor_use_until_from_ask");
}

#[test]
fn without_the_lag_in_the_lease_a_crashed_replicas_stored_sends_count_nowhere() {
    hole("no_lease_for_lag");
}

#[test]
fn reserving_against_a_read_older_than_ttl_plus_r_admits_past_the_ceiling() {
    hole("no_read_age");
}

#[test]
fn a_publish_issued_after_the_deadline_is_stored_when_no_term_counts_it() {
    hole("no_publish_deadline");
}

#[test]
fn a_ticket_of_the_old_epoch_published_into_the_new_one_hides_its_settles() {
    hole("no_old_ticket_drop");
}

#[test]
fn without_rollback_detection_a_failover_admits_past_the_ceiling() {
    hole("no_rollback_detection");
}

#[test]
fn flaw_epoch_and_version_miss_a_failover_until_a_replica_that_saw_the_lost_writes_calls() {
    hole("rollback_by_epoch_version");
}

#[test]
fn the_old_own_times_n_rule_admits_past_the_ceiling_when_cut_off() {
    hole("no_fail_closed");
}

#[test]
fn flaw_with_the_fleet_size_it_last_saw_a_cut_off_replica_admits_the_whole_room() {
    hole("alone_n_last_seen");
}

/// With the text's rule (the window of `H`, the part rounded up).
#[test]
fn flaw_with_a_window_of_h_a_cut_off_replica_admits_again_before_the_grants_it_cannot_see_show() {
    hole("alone_window_h");
}

#[test]
fn flaw_a_leave_that_drops_its_carry_after_a_restart_admits_past_the_ceiling() {
    hole("leave_drops_carry");
}

#[test]
fn an_old_epoch_ticket_is_too_old_to_use_once_the_grace_outlasts_ttl_plus_r() {
    no_hole("no_old_ticket_drop_long_grace");
}

#[test]
fn flaw_the_whole_fleet_cut_off_passes_the_ceiling_when_each_part_is_rounded_up() {
    hole("alone_part_ceil");
}

#[test]
fn a_batch_admitted_whole_on_a_short_grant_passes_the_ceiling() {
    hole("batch_whole");
}

#[test]
fn a_batch_split_on_a_short_grant_that_gives_the_grant_back_too_passes_the_ceiling() {
    hole("batch_split_give_back");
}

/// All or nothing is the batch's contract to its client, not what holds the ceiling: a
/// short grant's units used by as many entries (and not given back) are sends like any
/// other.
#[test]
fn a_batch_split_on_a_short_grant_holds_the_ceiling_when_nothing_is_given_back() {
    no_hole("batch_split");
}
