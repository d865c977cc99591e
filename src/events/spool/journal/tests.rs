//! Tests of the ids journal (`super`): records, heads and lengths read back as written, the
//! generations' rotation and bounds, snapshots and their crash-safe rewrite, and every damaged
//! or cut-short file a start must read up to its last whole block.

use super::*;
use std::os::unix::fs::FileExt;

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir.join(JOURNAL_DIR))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn started(dir: &Path, window: usize) -> (Journal, Vec<u64>) {
    let (mut j, loaded) = Journal::open(dir, window);
    assert!(j.wants_snapshot());
    j.snapshot(&loaded.ids, &Head::default(), None);
    assert!(!j.behind);
    (j, loaded.ids)
}

/// What is appended comes back after a restart, newest window only, distinct, oldest
/// first; a start's snapshot replaces the older files.
#[test]
fn appended_ids_come_back_newest_window_first() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 10_000;
    let (mut j, ids) = started(tmp.path(), window);
    assert!(ids.is_empty());
    let all: Vec<u64> = (1..=30_000u64).collect();
    for group in all.chunks(700) {
        j.append(group, &[], Head::default);
    }
    // An id stored again after it left the window counts at its newest place.
    j.append(&[5], &[], Head::default);
    j.sync();
    drop(j);
    let (_, ids) = started(tmp.path(), window);
    let mut want: Vec<u64> = all[all.len() - (window - 1)..].to_vec();
    want.push(5);
    assert_eq!(ids, want);
    // At most 1.25 windows on disk (plus the group that filled a generation).
    let (_, again) = started(tmp.path(), window);
    assert_eq!(again, want);
}

/// Format 2: each group's record gives the lengths of the files it wrote ids into, and
/// each generation starts with a head (the last file number, every open segment's
/// length). A start reads them back, the newest record of a file winning, also for a
/// quiet file whose record was in a generation removed since (a later head names it).
#[test]
fn the_files_lengths_come_back_with_the_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 2 * MIN_GENERATION_IDS;
    let (mut j, _) = started(tmp.path(), window);
    j.append(&[1], &[(3, 100)], Head::default);
    let head = || Head {
        last_n: 9,
        files: vec![(3, 100)],
    };
    for k in 0..16u64 {
        let group: Vec<u64> = (k * 1000 + 10..(k + 1) * 1000 + 10).collect();
        j.append(&group, &[(5, (k + 1) * 50)], head);
    }
    drop(j);
    assert!(files(tmp.path()).len() < 4, "{:?}", files(tmp.path()));
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    assert!(!loaded.ids.contains(&1), "the quiet id left the window");
    let lengths = loaded.lengths.clone().unwrap();
    assert_eq!(lengths.files.get(&3), Some(&100));
    assert_eq!(lengths.files.get(&5), Some(&800));
    assert_eq!(lengths.last_n, 9);
    // A start's snapshot writes a head of its own, which the next start reads.
    j.snapshot(
        &loaded.ids,
        &Head {
            last_n: 12,
            files: Vec::new(),
        },
        None,
    );
    drop(j);
    let (_, again) = Journal::open(tmp.path(), window);
    assert_eq!(again.ids, loaded.ids);
    assert_eq!(again.lengths.unwrap().last_n, 12);
}

/// A power loss that takes the end of a full generation (its last records and its end
/// block) but keeps the start of the next: the lengths of the newer generation are not
/// used (they may cover lines whose ids were lost), those before the cut are; every id
/// read still comes back.
#[test]
fn no_length_after_a_generation_cut_short_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 * MIN_GENERATION_IDS;
    let (mut j, _) = started(tmp.path(), window);
    let head = || Head {
        last_n: 50,
        files: vec![(5, 999)],
    };
    let first: Vec<u64> = (1..=MIN_GENERATION_IDS as u64 - 1).collect();
    j.append(&first, &[(5, 100)], head);
    // Fills the first generation: its end block, and the next one with its head.
    j.append(&[100_000], &[(5, 200)], head);
    j.append(&[100_001], &[(5, 300), (60, 10)], head);
    drop(j);
    let names = files(tmp.path());
    assert_eq!(names.len(), 2, "{names:?}");
    let (_, whole) = Journal::open(tmp.path(), window);
    let lengths = whole.lengths.unwrap();
    assert_eq!(lengths.files.get(&5), Some(&300));
    assert_eq!(lengths.last_n, 60);
    // The first generation loses its end block and its last record.
    let full = tmp.path().join(JOURNAL_DIR).join(&names[0]);
    let len = fs::metadata(&full).unwrap().len();
    let f = OpenOptions::new().write(true).open(&full).unwrap();
    f.set_len(len - 16 - (8 + 8) - (8 + 16)).unwrap();
    drop(f);
    let (_, cut) = Journal::open(tmp.path(), window);
    let lengths = cut.lengths.unwrap();
    assert_eq!(lengths.files.get(&5), Some(&100));
    assert_eq!(lengths.last_n, 5);
    assert!(cut.ids.contains(&100_001));
    assert!(!cut.ids.contains(&100_000));
}

/// Three generations, each filled by groups naming file 5 and a head naming the newest
/// file 50: the first ends at length 100, the second at 200, the third at 300.
fn three_generations(dir: &Path, window: usize) -> Vec<String> {
    let (mut j, _) = started(dir, window);
    let head = || Head {
        last_n: 50,
        files: vec![(5, 999)],
    };
    let per = MIN_GENERATION_IDS as u64;
    for (k, len) in [100u64, 200, 300].into_iter().enumerate() {
        let k = k as u64;
        // Each group fills a generation but the last.
        let group: Vec<u64> = (k * per + 1..=(k + 1) * per - u64::from(k == 2)).collect();
        j.append(&group, &[(5, len)], head);
    }
    drop(j);
    let names = files(dir);
    assert_eq!(names.len(), 3, "{names:?}");
    names
}

/// Review r40h D1: a middle generation lost its head (cut to 0 bytes by a power loss: it
/// was never synced; or a bit flipped in it). The newer generation's lengths are not used
/// (they cover the lines of the lost groups), those of the older one are.
#[test]
fn no_length_after_a_generation_without_a_head_is_used() {
    let window = 4 * MIN_GENERATION_IDS;
    for cut in ["empty", "half a magic", "flipped head"] {
        let tmp = tempfile::tempdir().unwrap();
        let names = three_generations(tmp.path(), window);
        let (_, whole) = Journal::open(tmp.path(), window);
        assert_eq!(whole.lengths.unwrap().files.get(&5), Some(&300));
        let middle = tmp.path().join(JOURNAL_DIR).join(&names[1]);
        match cut {
            "empty" => fs::write(&middle, b"").unwrap(),
            "half a magic" => fs::write(&middle, &MAGIC[..4]).unwrap(),
            _ => {
                let mut bytes = fs::read(&middle).unwrap();
                bytes[MAGIC.len() + BLOCK_HEAD] ^= 1;
                fs::write(&middle, &bytes).unwrap();
            }
        }
        let (_, cut_loaded) = Journal::open(tmp.path(), window);
        let lengths = cut_loaded.lengths.unwrap();
        assert_eq!(lengths.files.get(&5), Some(&100), "{cut}");
        assert_eq!(lengths.last_n, 5, "{cut}");
        assert!(cut_loaded
            .ids
            .contains(&(3 * MIN_GENERATION_IDS as u64 - 1)));
    }
}

/// Review r40h D1: a middle generation deleted. Generations are numbered one after the
/// other, so the gap stops the use of newer lengths.
#[test]
fn no_length_after_a_missing_generation_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 * MIN_GENERATION_IDS;
    let names = three_generations(tmp.path(), window);
    fs::remove_file(tmp.path().join(JOURNAL_DIR).join(&names[1])).unwrap();
    let (_, loaded) = Journal::open(tmp.path(), window);
    let lengths = loaded.lengths.unwrap();
    assert_eq!(lengths.files.get(&5), Some(&100));
    assert_eq!(loaded.damaged, 0);
}

/// The oldest generation read lost its head (cut to nothing, or damaged): its ids are
/// the oldest, so the newer generations' lengths are still used (review r40i D2: before,
/// no length was known, every line of the spool was reloaded as newer, and pushed the
/// journal's newest ids out of the window).
#[test]
fn a_lost_oldest_generation_costs_only_its_own_ids() {
    for damage in [&b""[..], &[0u8; 64][..]] {
        let tmp = tempfile::tempdir().unwrap();
        let window = 4 * MIN_GENERATION_IDS;
        let names = three_generations(tmp.path(), window);
        fs::write(tmp.path().join(JOURNAL_DIR).join(&names[0]), damage).unwrap();
        let (_, loaded) = Journal::open(tmp.path(), window);
        let lengths = loaded.lengths.unwrap();
        assert_eq!(lengths.files.get(&5), Some(&300));
        assert_eq!(lengths.last_n, 50);
        assert!(loaded.ids.contains(&(3 * MIN_GENERATION_IDS as u64 - 1)));
    }
}

/// The newest generation without a head (created by a rotation, cut to 0 bytes by a
/// power loss) stops nothing: the lengths before it are used.
#[test]
fn a_headless_newest_generation_keeps_the_lengths_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 * MIN_GENERATION_IDS;
    let names = three_generations(tmp.path(), window);
    fs::write(tmp.path().join(JOURNAL_DIR).join(&names[2]), b"").unwrap();
    let (_, loaded) = Journal::open(tmp.path(), window);
    assert_eq!(loaded.lengths.unwrap().files.get(&5), Some(&200));
}

/// Generations of format 1 before those of format 2 (an upgrade whose first snapshot was
/// cut short) are passed over, as before: they have no head by design.
#[test]
fn generations_of_format_1_do_not_stop_the_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 * MIN_GENERATION_IDS;
    let names = three_generations(tmp.path(), window);
    let mut bytes = MAGIC_V1.to_vec();
    encode_blocks(&mut bytes, KIND_IDS, &[u64::MAX - 7]);
    fs::write(
        tmp.path()
            .join(JOURNAL_DIR)
            .join(format!("{PREFIX}{:020}", 0)),
        &bytes,
    )
    .unwrap();
    assert!(names[0].ends_with('1'), "{names:?}");
    let (_, loaded) = Journal::open(tmp.path(), window);
    assert_eq!(loaded.lengths.unwrap().files.get(&5), Some(&300));
    assert!(loaded.ids.contains(&(u64::MAX - 7)));
}

/// A journal of format 1 (the binaries before) is read: its ids, and no lengths.
#[test]
fn a_journal_of_format_1_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join(JOURNAL_DIR)).unwrap();
    let mut bytes = MAGIC_V1.to_vec();
    encode_blocks(&mut bytes, KIND_IDS, &[7, 8, 9]);
    fs::write(
        tmp.path()
            .join(JOURNAL_DIR)
            .join(format!("{PREFIX}{:020}", 3)),
        &bytes,
    )
    .unwrap();
    let (_, loaded) = Journal::open(tmp.path(), 100);
    assert_eq!((loaded.ids, loaded.damaged), (vec![7, 8, 9], 0));
    assert!(loaded.lengths.is_none());
}

/// A smaller `--dedup-window` than the run that wrote the journal: the newest ids of its
/// larger generations come back, and nothing is called damaged.
#[test]
fn a_smaller_window_reads_the_newest_ids_of_larger_generations() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), 100_000);
    let all: Vec<u64> = (1..=30_000u64).collect();
    j.append(&all, &[], Head::default);
    drop(j);
    let (_, loaded) = Journal::open(tmp.path(), 100);
    assert_eq!(loaded.ids, all[all.len() - 100..].to_vec());
    assert_eq!(loaded.damaged, 0);
}

#[test]
fn the_journal_stays_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 40_000;
    let (mut j, _) = started(tmp.path(), window);
    for k in 0..200u64 {
        let group: Vec<u64> = (k * 1000 + 1..=(k + 1) * 1000).collect();
        j.append(&group, &[], Head::default);
        let bytes: u64 = fs::read_dir(tmp.path().join(JOURNAL_DIR))
            .unwrap()
            .flatten()
            .map(|e| e.metadata().unwrap().len())
            .sum();
        let bound = ((window + window / GENERATIONS_PER_WINDOW + 1000) * 8 + 4096) as u64;
        assert!(bytes <= bound, "{bytes} bytes on disk, bound {bound}");
    }
    assert!(files(tmp.path()).len() <= GENERATIONS_PER_WINDOW + 2);
}

/// A kill -9 in the middle of an append leaves an incomplete block: the ids before it
/// come back, and the start is not told of damage.
#[test]
fn a_torn_tail_is_cut_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), 1000);
    j.append(
        &[u64::MAX - 1, u64::MAX - 2, u64::MAX - 3],
        &[],
        Head::default,
    );
    let first_block_end = j.current_len;
    j.append(&[u64::MAX - 4, u64::MAX - 5], &[], Head::default);
    drop(j);
    let name = files(tmp.path()).pop().unwrap();
    let path = tmp.path().join(JOURNAL_DIR).join(name);
    let len = fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let (_, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!(loaded.ids, vec![u64::MAX - 1, u64::MAX - 2, u64::MAX - 3]);
    assert_eq!(loaded.damaged, 0);
    // A tail of zeros where the next block should start (a power loss after the size
    // grew) is the same.
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(first_block_end).unwrap();
    drop(f);
    let mut f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(&[0u8; 40]).unwrap();
    drop(f);
    let (_, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!((loaded.ids.len(), loaded.damaged), (3, 0));
}

/// A damaged block, garbage, a file of another format: the start goes on with what is
/// readable, reports the damage, and its snapshot replaces the damaged files.
#[test]
fn a_damaged_journal_never_blocks_a_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), 1000);
    j.append(&[21, 22], &[], Head::default);
    j.append(&[23, 24], &[], Head::default);
    drop(j);
    let name = files(tmp.path()).pop().unwrap();
    let path = tmp.path().join(JOURNAL_DIR).join(&name);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    fs::write(
        tmp.path()
            .join(JOURNAL_DIR)
            .join(format!("{PREFIX}{:020}", 0)),
        b"not a journal at all",
    )
    .unwrap();
    let (mut j, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!(loaded.ids, vec![21, 22]);
    assert_eq!(loaded.damaged, 2);
    j.snapshot(&loaded.ids, &Head::default(), None);
    assert_eq!(files(tmp.path()).len(), 1, "damaged files removed");
    drop(j);
    let (_, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!((loaded.ids, loaded.damaged), (vec![21, 22], 0));
    // An absurd count does not allocate: damaged.
    let mut bad = MAGIC.to_vec();
    bad.extend_from_slice(&[1, 2, 3, 4]);
    bad.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode_generation(&bad).1.is_some());
}

/// A generation larger than any run writes (here a sparse file of zeros: a start read
/// 8 GiB of them for 44 s before /readyz, review r40c D2) is not read: damaged, and the
/// ids of the others still come back.
#[test]
fn a_generation_larger_than_any_run_writes_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), 1000);
    j.append(&[31, 32], &[], Head::default);
    j.sync();
    drop(j);
    let huge = tmp
        .path()
        .join(JOURNAL_DIR)
        .join(format!("{PREFIX}{:020}", 1 << 30));
    let f = File::create(&huge).unwrap();
    f.write_all_at(MAGIC, 0).unwrap();
    f.set_len(MAX_GENERATION_BYTES + 1).unwrap();
    drop(f);
    // Read, its zeros would be a tail a crash left (no damage): counted damaged, it
    // was not read.
    let (_, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!((loaded.ids, loaded.damaged), (vec![31, 32], 1));
    assert!(!huge.exists(), "a file that gave no id is removed");
}

/// Review r40d D2: many files just under the cap, each a magic and then a hole (a sparse
/// tail of zeros: 8 of 511 MiB kept a start from /readyz for 82 s), are not read past
/// their data; the ids of the real generation still come back, and nothing is damaged.
#[test]
fn a_sparse_tail_is_not_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), 1000);
    j.append(&[41, 42], &[], Head::default);
    j.sync();
    drop(j);
    for k in 0..8u64 {
        let path = tmp
            .path()
            .join(JOURNAL_DIR)
            .join(format!("{PREFIX}{:020}", 1000 + k));
        let f = File::create(&path).unwrap();
        f.write_all_at(MAGIC, 0).unwrap();
        f.set_len(MAX_GENERATION_BYTES - (1 << 20)).unwrap();
    }
    let (_, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!((loaded.ids, loaded.damaged), (vec![41, 42], 0));
    // Each sparse file's first block (where the filesystem tells holes apart; /tmp
    // here), and the real generation.
    assert!(
        loaded.bytes_read <= 9 * 64 * 1024,
        "{} bytes read",
        loaded.bytes_read
    );
}

/// A start reads at most [`MAX_BYTES_READ_AT_START`] bytes of generations: the newest
/// files first, and a file past what is left is damaged without being read (here with a
/// budget of two generations' bytes).
#[test]
fn a_start_reads_at_most_its_budget_of_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 4 * MIN_GENERATION_IDS;
    let (mut j, _) = started(tmp.path(), window);
    let all: Vec<u64> = (1..=(3 * MIN_GENERATION_IDS) as u64).collect();
    for group in all.chunks(MIN_GENERATION_IDS) {
        j.append(group, &[], Head::default);
    }
    j.sync();
    drop(j);
    let sizes: Vec<u64> = files(tmp.path())
        .iter()
        .map(|n| {
            fs::metadata(tmp.path().join(JOURNAL_DIR).join(n))
                .unwrap()
                .len()
        })
        .collect();
    // Three full generations and the empty newest one.
    assert_eq!(sizes.len(), 4, "{sizes:?}");
    let two_newest: u64 = sizes[2..].iter().sum();
    let (mut j, _) = Journal::open(tmp.path(), 0);
    j.window = window;
    let loaded = j.load_within(two_newest + sizes[1] - 1);
    assert_eq!(loaded.bytes_read, two_newest);
    assert_eq!(loaded.ids, all[2 * MIN_GENERATION_IDS..].to_vec());
    assert_eq!(loaded.damaged, 2, "the two oldest files were not read");
}

/// A write that fails leaves the journal behind; the next snapshot brings it back, and
/// nothing of the failed append is read as damage.
#[test]
fn a_failed_write_is_made_good_by_a_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), 1000);
    j.append(&[1, 2], &[], Head::default);
    j.fall_behind("testing", &io::Error::other("disk full"));
    j.append(&[3], &[], Head::default);
    assert!(j.wants_snapshot());
    j.snapshot(&[1, 2, 3], &Head::default(), None);
    j.append(&[4], &[], Head::default);
    j.sync();
    drop(j);
    let (_, loaded) = Journal::open(tmp.path(), 1000);
    assert_eq!((loaded.ids, loaded.damaged), (vec![1, 2, 3, 4], 0));
}

fn journal_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir.join(JOURNAL_DIR))
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// Issue 40 (review): a crash at any step of a start's snapshot leaves a journal that reads
/// back the same window in the same order; a crash loop keeps it bounded. Before, the
/// oldest quarter was written first under the highest number, and a crash after it made
/// the newest ids the first to leave the window.
#[test]
fn a_crash_at_any_step_of_a_snapshot_keeps_the_window_and_its_order() {
    let window = 20_000;
    for stop in 0..=GENERATIONS_PER_WINDOW + 1 {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = started(tmp.path(), window);
        // More than a window, in groups, so that old generations exist beside it.
        let all: Vec<u64> = (1..=27_000u64).collect();
        for group in all.chunks(700) {
            j.append(group, &[], Head::default);
        }
        drop(j);
        let want = all[all.len() - window..].to_vec();
        let mut stops = vec![stop; 6];
        stops.push(usize::MAX);
        for (round, stop) in stops.into_iter().enumerate() {
            let (mut j, loaded) = Journal::open(tmp.path(), window);
            assert_eq!(loaded.ids, want, "round {round}, stopped after {stop}");
            assert_eq!(loaded.damaged, 0);
            j.stop_after = (stop != usize::MAX).then_some(stop);
            j.snapshot(&loaded.ids, &Head::default(), None);
            if round == 0 {
                // The crash came between a generation's write and its rename.
                fs::write(j.tmp_path_of(999), MAGIC).unwrap();
            }
            let bytes = journal_bytes(tmp.path());
            let bound = ((window * 5 / 2 + 700) * 8 + 8192) as u64;
            assert!(bytes <= bound, "{bytes} bytes on disk, bound {bound}");
        }
        let (_, loaded) = Journal::open(tmp.path(), window);
        assert_eq!(loaded.ids, want);
        let names = files(tmp.path());
        assert!(names.iter().all(|n| !n.ends_with(TMP_SUFFIX)), "{names:?}");
        assert!(names.len() <= GENERATIONS_PER_WINDOW + 1, "{names:?}");
    }
}

#[test]
fn a_window_of_zero_keeps_no_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, loaded) = Journal::open(tmp.path(), 0);
    assert!(loaded.ids.is_empty());
    assert!(!j.wants_snapshot());
    j.snapshot(&[1], &Head::default(), None);
    j.append(&[1], &[], Head::default);
    j.sync();
    assert!(!tmp.path().join(JOURNAL_DIR).exists());
}

#[test]
fn a_name_above_the_highest_generation_is_not_ours() {
    assert_eq!(generation_number("ids-00000000000000000007"), Some(7));
    assert_eq!(generation_number("ids-18446744073709551615"), None);
    assert_eq!(
        generation_number(&format!("ids-{:020}", MAX_GENERATION)),
        Some(MAX_GENERATION)
    );
    assert_eq!(generation_number("ids-7"), None);
}

/// Review r40n D1: a start that held reloaded ids beyond its window records the hold in its
/// snapshot; a start before a window of new ids were appended reads them all back as held
/// (they were lost to the window's newest ids), and one after reads the window only. The
/// generations holding them outlive rotations until then.
#[test]
fn a_hold_outlives_a_restart_until_a_window_of_new_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 1024;
    let (mut j, _) = started(tmp.path(), window);
    // The start: 1,024 journal ids, then 5,000 held (a window of 1,024, after a power loss
    // with a larger one).
    let ids: Vec<u64> = (1..=6024u64).collect();
    j.snapshot(&ids, &Head::default(), Some((5000, 0)));
    // 700 accepted after them, over rotations (a generation holds 4,096 ids at this window).
    for group in (100_001..=100_700u64).collect::<Vec<_>>().chunks(50) {
        j.append(group, &[], Head::default);
    }
    j.sync();
    drop(j);
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    assert_eq!(
        (loaded.held, loaded.after),
        (5000, 700),
        "the held ids, and the ones after them"
    );
    assert_eq!(loaded.ids.len(), 5700);
    assert_eq!(loaded.ids[0], 1025);
    assert_eq!(loaded.ids.last(), Some(&100_700));
    // That start holds them again, the 700 after them counting towards the hold's end
    // (review r40o D2: taken as held, a crash loop's new ids kept the hold from ending).
    j.snapshot(&loaded.ids, &Head::default(), Some((5000, 700)));
    drop(j);
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    assert_eq!((loaded.held, loaded.after), (5000, 700));
    assert_eq!(loaded.ids.len(), 5700);
    j.snapshot(&loaded.ids, &Head::default(), Some((5000, 700)));
    // 400 more: past a window of ids after the held ones; the hold ends.
    for group in (150_001..=150_400u64).collect::<Vec<_>>().chunks(50) {
        j.append(group, &[], Head::default);
    }
    j.sync();
    drop(j);
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    assert_eq!((loaded.held, loaded.after), (0, 0));
    assert_eq!(loaded.ids.len(), window);
    // The binaries before this one read the generations as ever: the hold is a file of its
    // own, which they leave alone (review r40o D1).
    assert!(files(tmp.path()).contains(&"hold".to_string()));
    j.snapshot(&loaded.ids, &Head::default(), None);
    assert!(
        !files(tmp.path()).contains(&"hold".to_string()),
        "a snapshot without a hold removes the file"
    );
    j.snapshot(&ids, &Head::default(), Some((5000, 0)));
    // 10 groups of 410 ids: past the window, and past a generation (rotations).
    for group in (200_001..=204_100u64).collect::<Vec<_>>().chunks(410) {
        j.append(group, &[], Head::default);
    }
    j.sync();
    drop(j);
    let (_, loaded) = Journal::open(tmp.path(), window);
    assert_eq!(loaded.held, 0, "a window of new ids ended the hold");
    assert_eq!(loaded.ids, (203_077..=204_100u64).collect::<Vec<_>>());
}

/// A hold mark past the bound of what a start holds is cut to it, newest ids first.
#[test]
fn a_hold_is_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let window = 16;
    let (mut j, _) = started(tmp.path(), window);
    let ids: Vec<u64> = (1..=(MAX_HELD_IDS as u64 + 100)).collect();
    j.snapshot(&ids, &Head::default(), Some((u32::MAX as usize, 3)));
    drop(j);
    let (_, loaded) = Journal::open(tmp.path(), window);
    assert_eq!((loaded.held, loaded.after), (MAX_HELD_IDS + window - 3, 3));
    assert_eq!(loaded.ids.len(), MAX_HELD_IDS + window);
    assert_eq!(loaded.ids.last(), Some(&(MAX_HELD_IDS as u64 + 100)));
}

/// Review r40p D1, D2: a start's rewrite of a window that holds ids, cut short (a kill -9) at
/// any step, once or in a crash loop: the next start reads the same hold, and the same ids.
/// The hold was written last, after the old generations were removed (a crash before it
/// lost the hold), and a rewrite cut short after its newest generations were renamed made
/// their ids count as accepted after the held ones (the hold ended at once).
#[test]
fn a_crash_at_any_step_of_a_snapshot_keeps_the_hold() {
    let window = 1024;
    // 9,000 held, then 300 accepted after them: a rewrite of three generations.
    for stop in 0..=3 {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = started(tmp.path(), window);
        let ids: Vec<u64> = (1..=10_024u64).collect();
        j.snapshot(&ids, &Head::default(), Some((9000, 0)));
        for group in (100_001..=100_300u64).collect::<Vec<_>>().chunks(50) {
            j.append(group, &[], Head::default);
        }
        j.sync();
        drop(j);
        let (_, want) = Journal::open(tmp.path(), window);
        assert_eq!((want.held, want.after), (9000, 300));
        for round in 0..4 {
            let (mut j, loaded) = Journal::open(tmp.path(), window);
            assert_eq!(
                (loaded.held, loaded.after),
                (9000, 300),
                "stopped after {stop}, round {round}"
            );
            assert_eq!(loaded.ids, want.ids, "stopped after {stop}, round {round}");
            j.stop_after = (round < 3 && stop < 3).then_some(stop);
            j.snapshot(&loaded.ids, &Head::default(), Some((9000, 300)));
        }
    }
}

/// Writes go to the log lines of `f`'s run, which it returns.
fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || out.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = buf.0.lock().unwrap().clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Review r40p D4: a hold file that is not one (cut, damaged, not a regular file) is
/// ignored with a WARN, as a damaged generation is (it was ignored silently); a start never
/// blocks or fails on it. A directory under its name does not keep the journal behind.
#[test]
fn a_damaged_hold_file_is_reported() {
    let window = 1024;
    let whole = HoldFile {
        now: Hold {
            generation: 1,
            snapshot_ids: 1,
            held: 1,
            inserted: 0,
        },
        before: None,
    }
    .encode();
    let mut bad_check = whole.clone();
    bad_check[10] ^= 1;
    type Make = Box<dyn Fn(&Path)>;
    let bytes = |b: Vec<u8>| -> Make { Box::new(move |p: &Path| fs::write(p, &b).unwrap()) };
    let cases: Vec<(&str, Make)> = vec![
        ("empty", bytes(Vec::new())),
        ("cut short", bytes(whole[..20].to_vec())),
        ("garbage", bytes(vec![0x5a; 44])),
        ("failed check", bytes(bad_check)),
        ("too long", bytes(vec![0; 1 << 20])),
        (
            "a link",
            Box::new(|p: &Path| std::os::unix::fs::symlink("/dev/zero", p).unwrap()),
        ),
        (
            "a FIFO",
            Box::new(|p: &Path| {
                let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
        ),
        (
            "a directory",
            Box::new(|p: &Path| fs::create_dir(p).unwrap()),
        ),
    ];
    for (what, make) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = started(tmp.path(), window);
        let ids: Vec<u64> = (1..=2000u64).collect();
        j.snapshot(&ids, &Head::default(), Some((1500, 0)));
        drop(j);
        let path = tmp.path().join(JOURNAL_DIR).join(HOLD_FILE);
        let _ = fs::remove_file(&path);
        make(&path);
        let mut opened = None;
        let log = logged(|| opened = Some(Journal::open(tmp.path(), window)));
        let (mut j, loaded) = opened.unwrap();
        assert!(log.contains("damaged hold file"), "{what}: {log}");
        assert_eq!((loaded.held, loaded.ids.len()), (0, window), "{what}");
        let log = logged(|| j.snapshot(&loaded.ids, &Head::default(), Some((500, 0))));
        assert!(!j.behind, "{what}: the journal stayed behind: {log}");
    }
}

/// The hold file of the binary before this one (one hold, no `before`) is read.
#[test]
fn a_hold_file_with_one_hold_is_read() {
    let now = Hold {
        generation: 7,
        snapshot_ids: 4096,
        held: 3900,
        inserted: 12,
    };
    let mut bytes = b"RHCHOLD1".to_vec();
    for w in [7u64, 4096, 3900, 12] {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    let check = block_check(&bytes[8..]);
    bytes.extend_from_slice(&check.to_le_bytes());
    assert_eq!(HoldFile { now, before: None }.encode(), bytes);
    assert_eq!(
        HoldFile::decode(&bytes),
        Some(HoldFile { now, before: None })
    );
    let two = HoldFile {
        now,
        before: Some(Hold::default()),
    };
    assert_eq!(HoldFile::decode(&two.encode()), Some(two));
    assert_eq!(two.encode().len() as u64, MAX_HOLD_FILE_BYTES);
}

/// Review r40q D1: a snapshot that held before writes a file of two holds while it renames
/// its generations, and the file of its hold alone once they are in place: the binaries
/// before this one read only that form (a file of two dropped the hold after a downgrade).
#[test]
fn a_finished_snapshot_leaves_a_hold_file_of_one_hold() {
    let window = 1024;
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = started(tmp.path(), window);
    let ids: Vec<u64> = (1..=10_024u64).collect();
    j.snapshot(&ids, &Head::default(), Some((9000, 0)));
    drop(j);
    let one = std::fs::read(tmp.path().join(JOURNAL_DIR).join(HOLD_FILE)).unwrap();
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    assert_eq!(loaded.held, 9000);
    j.snapshot(&loaded.ids, &Head::default(), Some((9000, 0)));
    drop(j);
    let after = std::fs::read(tmp.path().join(JOURNAL_DIR).join(HOLD_FILE)).unwrap();
    assert_eq!(after.len(), one.len(), "a file of two holds was left");
    let (_, loaded) = Journal::open(tmp.path(), window);
    assert_eq!(loaded.held, 9000);
}

/// The spool file of the model below (its number, and its length: every line of it).
const SPOOL_FILE: u64 = 7;
const SPOOL_LEN: u64 = 1000;

/// A start as recovery makes it (`super::super::recovery`), on a spool of one file,
/// [`SPOOL_FILE`], whose lines hold `spool` (oldest first): the journal read, the file's ids
/// reloaded as newer than the journal's where the lengths leave its lines uncovered (with no
/// lengths, a journal of format 1 or none: all of them, the window's worth), and the window
/// refilled as a start refills it.
fn model_start(dir: &Path, window: usize, spool: &[u64]) -> (Journal, DedupWindow, Loaded) {
    let (j, loaded) = Journal::open(dir, window);
    let uncovered = match &loaded.lengths {
        None => Some(0),
        Some(l) => l.unrecorded_from(SPOOL_FILE),
    };
    let newer: Vec<u64> = match uncovered {
        Some(0) => spool.iter().rev().copied().collect(),
        Some(len) if len < SPOOL_LEN => panic!("a length inside the spool's file: {len}"),
        _ => Vec::new(),
    };
    let mut w = DedupWindow::new(window);
    super::super::recovery::refill_window(
        &mut w,
        &loaded,
        &super::super::recovery::SpoolIds {
            newer,
            older: Vec::new(),
        },
    );
    (j, w, loaded)
}

use crate::util::dedup::DedupWindow;

/// The head a start writes with its snapshot: the spool's file, whole.
fn spool_head() -> Head {
    Head {
        last_n: SPOOL_FILE,
        files: vec![(SPOOL_FILE, SPOOL_LEN)],
    }
}

/// Starts on `dir` one after the other, each cut (a kill -9) at step `cuts[i]` of its
/// snapshot ([`Journal::crash_here`]; `None`: not cut), each checked to hold every id of
/// `spool` before it writes; then a clean start, and a start with the spool gone (its files
/// uploaded after a clean stop), which must hold them all from the journal alone.
fn crash_loop_holds_every_id(dir: &Path, window: usize, spool: &[u64], cuts: &[Option<usize>]) {
    for (round, &cut) in cuts.iter().chain([&None]).enumerate() {
        let (mut j, w, loaded) = model_start(dir, window, spool);
        let missing = spool.iter().filter(|&&id| !w.contains(id)).count();
        assert_eq!(
            missing,
            0,
            "start {round} after cuts {:?} lost ids: journal {} ids ({} held), lengths {:?}, files {:?}",
            &cuts[..round],
            loaded.ids.len(),
            loaded.held,
            loaded.lengths.map(|l| (l.last_n, l.files)),
            files(dir)
        );
        j.crash_at_step = cut;
        j.snapshot(&w.ids(), &spool_head(), w.hold());
    }
    let names = files(dir);
    assert!(
        !names.contains(&REWRITE_FILE.to_string()),
        "a complete rewrite left its mark: {names:?}"
    );
    let (_, w, _) = model_start(dir, window, &[]);
    let missing = spool.iter().filter(|&&id| !w.contains(id)).count();
    assert_eq!(missing, 0, "after cuts {cuts:?}, from the journal alone");
}

/// How many steps a snapshot of `ids` takes ([`Journal::crash_here`]), on a scratch journal.
fn snapshot_steps(window: usize, ids: &[u64], hold: Option<(usize, usize)>) -> usize {
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(tmp.path(), window);
    j.snapshot(ids, &spool_head(), hold);
    assert!(!j.behind);
    j.steps
}

/// The cut sequences of the sweeps below: each step alone, twice and three times in a row,
/// and followed by another one.
fn cut_sequences(steps: usize) -> Vec<Vec<Option<usize>>> {
    let mut out = Vec::new();
    for k in 0..=steps {
        out.push(vec![Some(k)]);
        out.push(vec![Some(k), Some(k)]);
        out.push(vec![Some(k), Some((k + 5) % (steps + 1)), Some(k)]);
    }
    out
}

/// Review r40t D1: a start whose window came from the spool's lines alone (no journal: an
/// upgrade from a binary without it, or a lost `dedup/` folder) rewrites the journal; cut
/// at any step (after each fsync, rename and folder sync), once or in a crash loop, the next
/// start holds every id again. Before, each generation of the rewrite had the whole head
/// (the spool covered) and the newest was renamed first: a start that found it alone took
/// the spool's lines as covered, and reloaded only its 212 ids of 12,500.
#[test]
fn a_rewrite_of_a_window_from_the_spools_lines_cut_at_any_step_keeps_every_id() {
    let window = 16_384;
    // Four generations of 4,096, 4,096, 4,096 and 212 ids.
    let spool: Vec<u64> = (1..=12_500u64).collect();
    let steps = snapshot_steps(window, &spool, None);
    assert!(steps >= 2 + 3 * 4, "{steps} steps");
    for cuts in cut_sequences(steps) {
        let tmp = tempfile::tempdir().unwrap();
        crash_loop_holds_every_id(tmp.path(), window, &spool, &cuts);
    }
}

/// Review r40t D1, its crash-loop form: a power loss took the records of 12,500 ids answered
/// with a larger window (65,536), so a start at 8,192 reloads them from the spool's lines
/// (the journal's head says they are newer) and holds them all beyond its window; its rewrite
/// (a hold) cut at any step, once or in a crash loop: the next start holds them all again.
/// Before, the journal's only generation (a head, no id) was removed at the first start as
/// one that gave no id, and the next took the cut rewrite's newest generation as covering
/// the spool (r40t: 8,576 of 16,000 stored twice).
#[test]
fn a_rewrite_holding_the_spools_lines_cut_at_any_step_keeps_every_id() {
    let window = 8192;
    let spool: Vec<u64> = (1..=12_500u64).collect();
    let steps = snapshot_steps(window, &spool, Some((spool.len(), 0)));
    for cuts in cut_sequences(steps) {
        let tmp = tempfile::tempdir().unwrap();
        // The run before: its start's snapshot (a head naming no file), then nothing
        // synced before the power loss.
        let (j, _) = started(tmp.path(), 65_536);
        drop(j);
        crash_loop_holds_every_id(tmp.path(), window, &spool, &cuts);
    }
}

/// A rewrite mark left by a snapshot that completed (a crash between its last rename and the
/// mark's removal, and a power loss that took the removal) is of no use once the journal
/// went on: after rotations removed the snapshot's oldest generations, a start still uses
/// the lengths of the generations after it. And a mark whose snapshot is all in place is
/// finished by the next start: the generations before it are removed.
#[test]
fn a_mark_of_a_complete_rewrite_changes_nothing() {
    let window = 4 * MIN_GENERATION_IDS;
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, _) = Journal::open(tmp.path(), window);
    let ids: Vec<u64> = (1..=window as u64).collect();
    j.snapshot(&ids, &spool_head(), None);
    let old: Vec<u64> = j.generations.iter().map(|g| g.0).collect();
    drop(j);
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    j.crash_at_step = Some(snapshot_steps(window, &loaded.ids, None) - 2);
    j.snapshot(&loaded.ids, &spool_head(), None);
    drop(j);
    let names = files(tmp.path());
    assert!(names.contains(&REWRITE_FILE.to_string()), "{names:?}");
    let mark =
        RewriteMark::decode(&fs::read(tmp.path().join(JOURNAL_DIR).join(REWRITE_FILE)).unwrap())
            .unwrap();
    assert!(mark.first > *old.last().unwrap());
    let (mut j, loaded) = Journal::open(tmp.path(), window);
    assert!(!loaded.unfinished);
    assert_eq!(loaded.ids, ids);
    assert_eq!(
        loaded.lengths.unwrap().unrecorded_from(SPOOL_FILE),
        Some(SPOOL_LEN)
    );
    assert!(
        j.generations.iter().all(|g| g.0 >= mark.first),
        "the generations before the complete snapshot were not removed: {:?}",
        j.generations
    );
    // The journal goes on: rotations remove the oldest generations of the snapshot; the
    // mark comes back (a power loss took its removal).
    j.snapshot(&loaded.ids, &spool_head(), None);
    let newer: Vec<u64> = (100_001..=100_000 + window as u64).collect();
    for group in newer.chunks(1000) {
        j.append(group, &[(SPOOL_FILE, SPOOL_LEN + 10)], spool_head);
    }
    j.sync();
    let first = j.generations.front().unwrap().0;
    drop(j);
    let stale = RewriteMark {
        from: first - 2,
        first: first - 2,
        top: first + 1,
    };
    fs::write(
        tmp.path().join(JOURNAL_DIR).join(REWRITE_FILE),
        stale.encode(),
    )
    .unwrap();
    let (_, loaded) = Journal::open(tmp.path(), window);
    assert!(!loaded.unfinished);
    assert_eq!(
        loaded.lengths.unwrap().unrecorded_from(SPOOL_FILE),
        Some(SPOOL_LEN + 10)
    );
}

/// A damaged rewrite mark is reported and left out, as a damaged hold file is; the start
/// goes on.
#[test]
fn a_damaged_rewrite_mark_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let (j, _) = started(tmp.path(), 1000);
    drop(j);
    let mut bytes = RewriteMark {
        from: 1,
        first: 2,
        top: 3,
    }
    .encode();
    bytes[9] ^= 1;
    fs::write(tmp.path().join(JOURNAL_DIR).join(REWRITE_FILE), &bytes).unwrap();
    let mut opened = None;
    let log = logged(|| opened = Some(Journal::open(tmp.path(), 1000)));
    assert!(log.contains("damaged rewrite mark"), "{log}");
    let (mut j, loaded) = opened.unwrap();
    assert!(!loaded.unfinished);
    j.snapshot(&loaded.ids, &Head::default(), None);
    assert!(!j.behind);
    assert!(!files(tmp.path()).contains(&REWRITE_FILE.to_string()));
}

/// A rewrite cut short is told apart beside a file named above the numbers the journal
/// uses (not one it wrote after the mark): the next start still reloads the spool's lines.
#[test]
fn a_foreign_file_above_the_numbering_does_not_hide_a_cut_rewrite() {
    let window = 16_384;
    let spool: Vec<u64> = (1..=12_500u64).collect();
    let tmp = tempfile::tempdir().unwrap();
    let (mut j, w, _) = model_start(tmp.path(), window, &spool);
    let mut foreign = MAGIC.to_vec();
    encode_blocks(&mut foreign, KIND_IDS, &[u64::MAX - 3]);
    fs::write(
        tmp.path()
            .join(JOURNAL_DIR)
            .join(format!("{PREFIX}{:020}", NUMBERING_LIMIT + 5)),
        &foreign,
    )
    .unwrap();
    // Cut after the newest generation was renamed: the hold (none), the mark, its sync,
    // rename and folder sync.
    j.crash_at_step = Some(5);
    j.snapshot(&w.ids(), &spool_head(), w.hold());
    drop(j);
    let (_, w, loaded) = model_start(tmp.path(), window, &spool);
    assert!(loaded.unfinished);
    assert!(spool.iter().all(|&id| w.contains(id)));
}
