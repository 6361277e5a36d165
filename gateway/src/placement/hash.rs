//! Citus' hash of a bigint distribution column, computed here so that the
//! gateway finds an object's shard without asking the database.
//!
//! Citus hashes a value with the hash function of its type's default hash
//! operator class, for `bigint` PostgreSQL's `hashint8`, and keeps the
//! result as a signed `int32`: `pg_dist_shard` stores each shard's range of
//! those hashes. `hashint8` folds the high half into the low half (so that
//! an `int8` equal to an `int4` hashes alike), then hashes the 32 bits with
//! `hash_bytes_uint32`, the final mix of Bob Jenkins' lookup3
//! (PostgreSQL's src/common/hashfn.c).

/// The hash Citus places `object` by (`hashint8`, as `int4`).
pub fn hashint8(object: i64) -> i32 {
    let (low, high) = (object as u32, (object >> 32) as u32);
    let folded = low ^ if object >= 0 { high } else { !high };
    hash_bytes_uint32(folded) as i32
}

/// lookup3's hash of one 32-bit word: the initial state for a 4-byte key,
/// the word added to `a`, then `final(a, b, c)`.
fn hash_bytes_uint32(k: u32) -> u32 {
    let init = 0x9e37_79b9_u32.wrapping_add(4).wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (init.wrapping_add(k), init, init);
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

#[cfg(test)]
mod tests {
    use super::hashint8;

    /// `SELECT x, hashint8(x)` on PostgreSQL 15 (equal to Citus'
    /// `worker_hash(x)`): zero, signs, the 32-bit boundary, ids with a node
    /// group in their top 16 bits (`1 << 48`), the extremes.
    const SERVER: &[(i64, i32)] = &[
        (0, -272711505),
        (1, -1905060026),
        (-1, 385747274),
        (2, 1134484726),
        (42, 1509752520),
        (-42, -487492805),
        (1000, -840720108),
        (4294967295, 385747274),
        (4294967296, -1905060026),
        (-4294967296, -272711505),
        (-4294967297, -1242090879),
        (281474976710656, 32085720),
        (281474976710657, 607654552),
        (9223372036854775807, -1524351049),
        (-9223372036854775808, -96758253),
        (1234567890123, 952082253),
        (-987654321987, 841838153),
    ];

    #[test]
    fn hashes_as_the_server_does() {
        for &(x, expected) in SERVER {
            assert_eq!(hashint8(x), expected, "hashint8({x})");
        }
    }

    /// Against a live server, when the suite has one: many ids, both signs,
    /// small and large; with Citus there, also against its `worker_hash`.
    #[test]
    fn hashes_many_ids_as_a_live_server_does() {
        let Ok(url) = std::env::var("LAMBDASTORE_TEST_URL") else {
            eprintln!("skipped: LAMBDASTORE_TEST_URL is not set");
            return;
        };
        let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connect to LAMBDASTORE_TEST_URL");
        let mut ids: Vec<i64> = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in 0..20_000_i64 {
            // A 64-bit LCG: ids spread over the whole range, and small ones.
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ids.extend([x as i64, (x >> 40) as i64, -((x >> 40) as i64), i - 10_000, (1 << 48) + i]);
        }
        let citus: bool = client.query_one("SELECT to_regproc('worker_hash') IS NOT NULL", &[]).unwrap().get(0);
        let sql = if citus {
            "SELECT x, hashint8(x), worker_hash(x) FROM unnest($1::bigint[]) x"
        } else {
            "SELECT x, hashint8(x), hashint8(x) FROM unnest($1::bigint[]) x"
        };
        let rows = client.query(sql, &[&ids]).unwrap();
        assert_eq!(rows.len(), ids.len());
        for row in rows {
            let (x, postgres, citus): (i64, i32, i32) = (row.get(0), row.get(1), row.get(2));
            assert_eq!(hashint8(x), postgres, "hashint8({x})");
            assert_eq!(hashint8(x), citus, "worker_hash({x})");
        }
    }
}
