//! Which hash range of a Citus table holds an object: Citus' hash of the
//! bigint distribution column, and the lookup of the range holding it.
//! The extension places its statements with it (cluster/layout.rs) and the
//! gateway routes calls with it (placement/citus.rs), each from its own
//! read of `pg_dist_shard`.
//!
//! Citus hashes a value with the hash function of its type's default hash
//! operator class, for `bigint` PostgreSQL's `hashint8`, and keeps the
//! result as a signed `int32`: `pg_dist_shard` stores each shard's range of
//! those hashes. `hashint8` folds the high half into the low half (so that
//! an `int8` equal to an `int4` hashes alike), then hashes the 32 bits with
//! `hash_bytes_uint32`, the final mix of Bob Jenkins' lookup3
//! (PostgreSQL's src/common/hashfn.c).

/// Citus' shard map of lambdastore's tables, read by the extension
/// (cluster/layout.rs, through SPI) and by the gateway (placement/citus.rs,
/// through a client): a row per shard placement on a primary node, by
/// lowest hash, then table name. Columns: the table, the shard id, its
/// hash range (0 and 0 for a reference table's one shard, listed only for
/// this node's copy), the node's group, host and port, whether the node
/// is active, and the group of the node that answers. By names, not
/// `'lambdastore.objects'::regclass`: the gateway's role has no USAGE on
/// the schema (every role may read these catalogs).
pub const SHARD_MAP: &str = "
    SELECT c.relname::text, s.shardid, coalesce(s.shardminvalue::int, 0), coalesce(s.shardmaxvalue::int, 0),
           p.groupid, n.nodename::text, n.nodeport, n.isactive, g.groupid
      FROM pg_dist_shard s
      JOIN pg_class c ON c.oid = s.logicalrelid
      JOIN pg_namespace ns ON ns.oid = c.relnamespace
      JOIN pg_dist_placement p ON p.shardid = s.shardid
      JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
     CROSS JOIN pg_dist_local_group g
     WHERE ns.nspname = 'lambdastore' AND (s.shardminvalue IS NOT NULL OR p.groupid = g.groupid)
     ORDER BY 3, 1";

/// Whether Citus' metadata, and so `SHARD_MAP`, can be read here.
pub const CITUS_HERE: &str = "SELECT to_regclass('pg_catalog.pg_dist_shard') IS NOT NULL";

/// The hash Citus places `object` by (`hashint8`, as `int4`).
#[inline]
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

/// The index in `ranges` of the one holding `object`'s hash. `ranges` are
/// sorted by their lowest hash and do not overlap; `bounds` gives a range's
/// lowest and highest hash (both included). None when no range holds it:
/// a gap is a range whose node is not known (or not active).
pub fn range_of<R>(ranges: &[R], bounds: impl Fn(&R) -> (i32, i32), object: i64) -> Option<usize> {
    let hash = hashint8(object);
    let at = ranges.partition_point(|r| bounds(r).0 <= hash).checked_sub(1)?;
    (hash <= bounds(&ranges[at]).1).then_some(at)
}

/// Whether `ranges`, sorted by their lowest hash, cover every hash once,
/// as a hash-distributed table's shards do: no gap, no overlap.
pub fn cover_all<R>(ranges: &[R], bounds: impl Fn(&R) -> (i32, i32)) -> bool {
    let mut next = Some(i32::MIN);
    for range in ranges {
        let (min, max) = bounds(range);
        if next != Some(min) || max < min {
            return false;
        }
        next = max.checked_add(1);
    }
    next.is_none() && !ranges.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SELECT x, hashint8(x)` on PostgreSQL 15 (equal to Citus'
    /// `worker_hash(x)`): zero, signs, the 32-bit boundary, ids with a node
    /// group in their top 16 bits (`1 << 48`), the extremes. The gateway's
    /// tests compare many more against a live server.
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

    fn bounds(r: &(i32, i32, &'static str)) -> (i32, i32) {
        (r.0, r.1)
    }

    /// An isolated tenant leaves three ranges where there was one: the
    /// object's own, one hash wide, between the two halves of the old range.
    #[test]
    fn an_object_is_in_the_range_holding_its_hash_even_one_hash_wide() {
        let isolated = 42_i64;
        let h = hashint8(isolated);
        let ranges = [(i32::MIN, h - 1, "w1"), (h, h, "w2"), (h + 1, i32::MAX, "w1")];
        assert!(cover_all(&ranges, bounds));
        assert_eq!(range_of(&ranges, bounds, isolated), Some(1));
        let neighbours = (0..10_000_i64).filter(|&id| id != isolated);
        assert!(neighbours.map(|id| ranges[range_of(&ranges, bounds, id).unwrap()].2).all(|n| n == "w1"));
    }

    #[test]
    fn a_hash_in_no_range_has_none() {
        let (h, w) = (hashint8(7), 1 << 20);
        let ranges = [(h - w, h + w, "w1")];
        assert!(!cover_all(&ranges, bounds));
        assert_eq!(range_of(&ranges, bounds, 7), Some(0));
        let outside = (0..1000_i64).find(|&id| !(h - w..=h + w).contains(&hashint8(id))).unwrap();
        assert_eq!(range_of(&ranges, bounds, outside), None);
    }

    #[test]
    fn a_gap_or_an_overlap_does_not_cover_all() {
        assert!(cover_all(&[(i32::MIN, i32::MAX, "w1")], bounds));
        assert!(cover_all(&[(i32::MIN, -1, "w1"), (0, i32::MAX, "w2")], bounds));
        assert!(!cover_all(&[(i32::MIN, -2, "w1"), (0, i32::MAX, "w2")], bounds));
        assert!(!cover_all(&[(i32::MIN, 0, "w1"), (0, i32::MAX, "w2")], bounds));
        assert!(!cover_all(&[(i32::MIN, -1, "w1")], bounds));
        assert!(!cover_all::<(i32, i32, &str)>(&[], bounds));
    }
}
