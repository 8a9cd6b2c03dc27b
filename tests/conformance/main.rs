//! The store conformance suite: every case of `cases` against every backend, as
//! `<backend>::<case>` (`cargo test --test conformance sqlite::` runs one backend).

mod cases;
mod operate;
mod postgres_only;
mod redis_only;
mod sqlite_files;
mod state;

/// Declares one module per backend with one test per case; every backend gets the same list.
macro_rules! conformance_suite {
    ($($backend:ident => $fixture:path),* $(,)?) => {
        $(conformance_suite!(@backend $backend, $fixture,
            claim_with_no_state_wins_attempt_one,
            second_claim_of_the_same_slot_sees_running,
            retried_claim_with_the_same_token_returns_the_same_win,
            heartbeat_with_the_current_token_extends_the_lease,
            heartbeats_keep_a_run_alive_longer_than_its_lease,
            heartbeat_with_an_old_token_is_refused,
            heartbeat_for_a_run_without_state_is_lost,
            release_ends_the_lease_at_once,
            heartbeat_after_release_does_not_renew,
            hand_over_records_the_attempt_as_handed_over,
            finish_with_the_current_token_records_success,
            failed_run_is_finished_and_not_retried,
            finish_with_a_stale_token_is_refused,
            release_with_a_stale_token_is_refused,
            finish_after_release_is_refused,
            second_finish_of_a_run_is_refused,
            takeover_claim_while_the_lease_is_alive_sees_running,
            takeover_after_lease_expiry_starts_attempt_two_with_new_token_and_fence,
            max_attempts_interrupts_after_three_dead_runners,
            max_attempts_of_one_interrupts_after_the_first_dead_runner,
            max_attempts_of_five_allows_five_attempts_then_interrupts,
            takeover_of_a_run_older_than_max_late_plus_tolerance_starts_the_next_attempt,
            heartbeat_after_the_lease_ran_out_before_any_takeover_is_refused,
            hand_overs_do_not_count_toward_max_attempts,
            several_backups_race_one_takeover_wins,
            next_slot_while_the_dead_runs_lease_is_alive_is_an_overlap,
            backup_takeover_first_then_the_next_slot_is_an_overlap,
            next_slot_first_interrupts_the_dead_run_and_it_is_not_retried,
            takeover_of_a_dead_run_with_a_newer_run_marks_it_interrupted,
            overlap_skip_refuses_a_new_slot_while_an_earlier_lease_is_alive,
            overlap_skip_lets_a_new_slot_start_once_the_earlier_lease_is_dead,
            overlap_allow_runs_slots_side_by_side,
            claim_later_than_max_late_plus_tolerance_is_late,
            claim_within_max_late_plus_tolerance_wins,
            catch_up_claim_within_the_catch_up_window_is_not_late,
            catch_up_claim_older_than_the_window_is_late,
            catch_up_race_one_instance_wins_the_other_becomes_backup,
            claim_for_a_slot_older_than_an_existing_run_is_superseded,
            frozen_runner_is_fenced_after_takeover,
            fence_grows_with_every_won_claim_of_the_job,
            fence_is_never_below_the_stores_clock_in_microseconds_at_the_claim,
            attempt_record_keeps_runner_token_start_end_and_outcome,
            unfinished_lists_running_runs_oldest_first,
            history_is_trimmed_to_its_size,
            history_never_loses_a_run_a_late_claim_could_ask_about,
            sixteen_concurrent_claimers_get_exactly_one_winner_500_times,
            four_processes_racing_on_200_slots_get_one_winner_each,
            a_run_costs_one_round_trip_per_claim_heartbeat_and_finish,
            raw_primitive_writes_a_new_key_once,
            forget_job_deletes_its_runs_and_name,
            state_write_with_the_current_token_is_accepted_and_records_its_writer,
            state_write_with_the_old_token_after_a_takeover_is_fenced_and_changes_nothing,
            state_write_after_finish_or_release_is_fenced,
            state_write_of_a_late_attempt_whose_lease_ran_out_is_fenced,
            state_increments_from_sixteen_concurrent_attempts_sum_exactly,
            state_increment_is_exact_for_sixty_four_bit_integers_and_refuses_other_values,
            state_compare_and_swap_writes_only_over_the_expected_value,
            state_of_one_job_or_namespace_is_invisible_to_another,
            state_limits_refuse_long_keys_large_values_and_one_key_too_many,
            state_write_costs_one_round_trip_and_a_read_one,
            state_remove_by_an_operator_and_forget_job_delete_the_state,
            paused_job_claims_answer_paused_on_every_node_and_start_nothing,
            paused_job_is_not_taken_over_but_its_running_attempt_finishes,
            paused_claim_sent_again_with_its_token_keeps_the_win_it_had,
            paused_trigger_is_refused_with_the_pause_in_force,
            paused_jobs_are_listed_with_who_when_and_why_until_resumed,
            paused_racing_claims_never_start_an_attempt_after_the_pause,
            manual_trigger_is_a_slot_at_the_stores_clock_in_the_record,
            manual_claims_of_a_trigger_have_one_winner_with_reason_manual,
            manual_claim_is_an_overlap_while_a_scheduled_run_holds_a_live_lease,
            manual_run_whose_runner_dies_is_taken_over_as_attempt_two,
            manual_claim_later_than_max_late_plus_tolerance_is_late,
        );)*
    };
    (@backend $backend:ident, $fixture:path, $($case:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let fixture = $fixture().await;
                    crate::cases::$case(&fixture).await;
                }
            )*
        }
    };
}

conformance_suite! {
    sqlite => baton_tests::backends::sqlite,
    simulated => baton_tests::backends::simulated,
    redis => baton_tests::backends::redis,
    valkey => baton_tests::backends::valkey,
    postgres => baton_tests::backends::postgres,
    redis_cluster => baton_tests::backends::redis_cluster,
}
