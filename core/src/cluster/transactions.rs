//! Citus' names for its two-phase commits. Citus prepares each node's part
//! of a distributed transaction as `citus_<group>_<pid>_<number>_<connection>`
//! (`PREPARED_TRANSACTION_NAME_FORMAT` in its remote_transaction.c), where
//! `<group>` is the group of the node that runs the distributed
//! transaction. That node's recovery (`recover_prepared_transactions`, run
//! every `citus.recover_2pc_interval` by its maintenance daemon) looks at
//! the prepared transactions named after its group on every node, and
//! rolls back those it did not record as committing: one so named by
//! anyone else ends that way.

/// The group in `name` when it is of the form Citus names its prepared
/// transactions.
pub fn group_of_citus_prepared(name: &str) -> Option<i32> {
    let parts: Vec<&str> = name.strip_prefix("citus_")?.split('_').collect();
    let numeric = |part: &&str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    (parts.len() == 4 && parts.iter().all(numeric)).then(|| parts[0].parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::group_of_citus_prepared;

    #[test]
    fn citus_names_and_others() {
        assert_eq!(group_of_citus_prepared("citus_0_12345_7_2"), Some(0));
        assert_eq!(group_of_citus_prepared("citus_14_99_18446744073709551615_0"), Some(14));
        for other in [
            "alice_hold",
            "citus_0_1_2",
            "citus_0_1_2_3_4",
            "citus_0_1__3",
            "citus_0_x_2_3",
            "Citus_0_1_2_3",
            "citus_99999999999_1_2_3",
            "",
        ] {
            assert_eq!(group_of_citus_prepared(other), None, "{other}");
        }
    }
}
