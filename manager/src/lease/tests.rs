//! The lease's state machine under a fake clock: several managers whose monotonic clocks run
//! at slightly different rates from different origins and whose wall clocks disagree by
//! minutes, reads and writes that take time (a write lands after others have read), stores
//! that fail (a failed write may have landed all the same), managers stopped past their lease
//! (SIGSTOP) and killed. At no instant may two managers act; once the faults end, one does.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::elector::{Elector, Read, Record, Timing, Transition, Write};

const D: f64 = 15.0;

fn rec(holder: &str, transitions: u32) -> Record {
    Record {
        holder: holder.into(),
        duration_s: D,
        acquired_at: 0.0,
        renewed_at: 0.0,
        transitions,
    }
}

#[test]
fn the_first_manager_creates_the_lease_and_acts_until_its_renewal_deadline() {
    let mut a = Elector::new("a", Timing::of(D));
    let empty = Read {
        record: None,
        version: None,
    };
    let (w, lost) = a.on_read(&empty, 100.0, 5.0);
    assert_eq!(lost, None);
    let w = w.expect("creates it");
    assert!(matches!(&w, Write::Create(r) if r.holder == "a"));
    assert!(!a.may_act(100.0), "not before the write is stored");
    assert_eq!(
        a.on_write(&w, true, 100.0),
        Some(Transition::Acquired {
            previous: String::new()
        })
    );
    assert!(a.may_act(100.0) && a.may_act(109.9));
    assert!(
        !a.may_act(110.0),
        "⅔ of the lease after the start of its write"
    );
    // Renewal is due a third of the lease after the last one.
    assert_eq!(a.next_round(100.0), 105.0);
    assert_eq!(
        a.tick(110.0).map(|t| matches!(t, Transition::Lost { .. })),
        Some(true)
    );
}

#[test]
fn a_standby_waits_the_whole_lease_on_its_own_clock_then_takes_it_over() {
    let mut b = Elector::new("b", Timing::of(D));
    let read = Read {
        record: Some(rec("a", 3)),
        version: Some("7".into()),
    };
    // b's own clock starts anywhere; the record's Unix times say nothing to it.
    assert_eq!(b.on_read(&read, 1000.0, 0.0).0, None);
    assert_eq!(b.on_read(&read, 1014.9, 0.0).0, None);
    let (w, _) = b.on_read(&read, 1015.0, 0.0);
    let w = w.expect("unchanged for 15 s: taken over");
    match &w {
        Write::Replace { record, version } => {
            assert_eq!((record.holder.as_str(), record.transitions), ("b", 4));
            assert_eq!(version, "7", "a compare-and-swap on the version seen");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.on_write(&w, true, 1015.0),
        Some(Transition::Acquired {
            previous: "a".into()
        })
    );
}

#[test]
fn a_renewal_seen_restarts_the_standbys_wait() {
    let mut b = Elector::new("b", Timing::of(D));
    let v = |n: &str, renewed: f64| Read {
        record: Some(Record {
            renewed_at: renewed,
            ..rec("a", 0)
        }),
        version: Some(n.into()),
    };
    b.on_read(&v("1", 0.0), 0.0, 0.0);
    b.on_read(&v("2", 5.0), 10.0, 0.0);
    assert_eq!(b.on_read(&v("2", 5.0), 24.9, 0.0).0, None);
    assert!(b.on_read(&v("2", 5.0), 25.0, 0.0).0.is_some());
}

#[test]
fn a_released_lease_is_taken_at_once_and_a_holder_that_sees_another_steps_down() {
    let mut a = Elector::new("a", Timing::of(D));
    let w = Write::Create(rec("a", 0));
    a.on_write(&w, true, 0.0);
    let theirs = Read {
        record: Some(rec("b", 1)),
        version: Some("9".into()),
    };
    let (_, lost) = a.on_read(&theirs, 1.0, 0.0);
    assert!(matches!(lost, Some(Transition::Lost { .. })));
    assert!(!a.may_act(1.0));
    let released = Read {
        record: Some(rec("", 1)),
        version: Some("10".into()),
    };
    let (w, _) = a.on_read(&released, 2.0, 0.0);
    assert!(matches!(w, Some(Write::Replace { ref record, .. }) if record.transitions == 1));
}

#[test]
fn a_holder_that_cannot_renew_stops_before_anyone_may_take_over() {
    let mut a = Elector::new("a", Timing::of(D));
    a.on_write(&Write::Create(rec("a", 0)), true, 0.0);
    // Its renewals fail (the store is unreachable): it tries every 2 s, and stops at 10 s.
    a.on_error(5.0);
    assert_eq!(a.next_round(5.0), 7.0);
    assert!(a.may_act(9.99));
    assert!(!a.may_act(10.0));
}

/// A shared store with compare-and-swap, as both real stores are.
#[derive(Default)]
struct FakeStore {
    record: Option<Record>,
    version: u64,
}

impl FakeStore {
    fn read(&self) -> Read {
        Read {
            record: self.record.clone(),
            version: self.record.as_ref().map(|_| self.version.to_string()),
        }
    }

    fn write(&mut self, w: &Write) -> bool {
        let ok = match (w, &self.record) {
            (Write::Create(_), None) => true,
            (Write::Replace { version, .. }, Some(_)) => *version == self.version.to_string(),
            _ => false,
        };
        if ok {
            self.record = Some(w.record().clone());
            self.version += 1;
        }
        ok
    }
}

/// A small deterministic generator for the simulation's choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Sim {
    e: Elector,
    /// Monotonic clock: origin and rate (1 ± 1e-3, far worse than any real clock).
    origin: f64,
    rate: f64,
    /// Stopped (SIGSTOP) until this true time; killed for good.
    stopped_until: f64,
    killed: bool,
}

impl Sim {
    fn mono(&self, t: f64) -> f64 {
        self.origin + t * self.rate
    }
}

#[derive(Debug)]
enum Ev {
    Round(usize),
    /// A write sent at the manager's monotonic `started` lands; `reported` false: the store
    /// took it but the manager is told it failed (a timeout after the fact).
    Land {
        who: usize,
        write: Write,
        started: f64,
        reported: bool,
    },
}

/// Runs `managers` electors for `until` seconds of true time with faults until `faults_end`;
/// returns (true time, holders acting) at the first instant two act, if any, and who acts at
/// the end.
fn simulate(
    seed: u64,
    managers: usize,
    until: f64,
    faults_end: f64,
) -> (Option<(f64, Vec<usize>)>, Vec<usize>) {
    let mut rng = Rng(seed | 1);
    let mut store = FakeStore::default();
    let mut sims: Vec<Sim> = (0..managers)
        .map(|i| Sim {
            e: Elector::new(format!("m{i}"), Timing::of(D)),
            origin: rng.unit() * 1e6,
            rate: 1.0 + (rng.unit() - 0.5) * 2e-3,
            stopped_until: 0.0,
            killed: false,
        })
        .collect();
    // Events by (true time in µs, sequence).
    let mut queue: BTreeMap<(u64, u64), Ev> = BTreeMap::new();
    let mut seq = 0u64;
    let mut push = |q: &mut BTreeMap<(u64, u64), Ev>, t: f64, ev: Ev| {
        seq += 1;
        // Rounded up, a microsecond late: an event never runs before the time it was due.
        q.insert(((t * 1e6).ceil() as u64 + 1, seq), ev);
    };
    for i in 0..managers {
        push(&mut queue, rng.unit() * 3.0, Ev::Round(i));
    }
    let mut violation = None;
    let mut alive = managers;
    while let Some(((t_us, _), ev)) = queue.pop_first() {
        let t = t_us as f64 / 1e6;
        if t > until {
            break;
        }
        let faulty = t < faults_end;
        match ev {
            Ev::Round(i) => {
                let s = &mut sims[i];
                if s.killed {
                    continue;
                }
                if t < s.stopped_until {
                    let at = s.stopped_until;
                    push(&mut queue, at, Ev::Round(i));
                    continue;
                }
                // Faults: a kill, a stop past the lease, an unreadable store.
                if faulty && rng.unit() < 0.01 && alive > 1 {
                    s.killed = true;
                    alive -= 1;
                    continue;
                }
                if faulty && rng.unit() < 0.03 {
                    s.stopped_until = (t + rng.unit() * 3.0 * D).min(faults_end);
                }
                let now = s.mono(t);
                s.e.tick(now);
                if faulty && rng.unit() < 0.1 {
                    s.e.on_error(now);
                } else {
                    let read = store.read();
                    let (w, _) = s.e.on_read(&read, now, rng.unit() * 1e9);
                    if let Some(write) = w {
                        // The write takes up to 3 s (a slow API server), longer under faults.
                        let delay = rng.unit() * if faulty { 6.0 } else { 1.0 };
                        let reported = !(faulty && rng.unit() < 0.1);
                        push(
                            &mut queue,
                            t + delay,
                            Ev::Land {
                                who: i,
                                write,
                                started: now,
                                reported,
                            },
                        );
                        continue;
                    }
                }
                let next = s.e.next_round(now);
                let at = t + (next - now) / s.rate;
                push(&mut queue, at, Ev::Round(i));
            }
            Ev::Land {
                who,
                write,
                started,
                reported,
            } => {
                let stored = store.write(&write);
                let s = &mut sims[who];
                if s.killed {
                    continue;
                }
                s.e.on_write(&write, stored && reported, started);
                let now = s.mono(t);
                let at = t + (s.e.next_round(now) - now) / s.rate;
                push(&mut queue, at, Ev::Round(who));
            }
        }
        // The set of managers that may act grows only when a write lands: check every
        // instant at which something happened.
        let acting: Vec<usize> = sims
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.killed && s.e.may_act(s.mono(t)))
            .map(|(i, _)| i)
            .collect();
        if acting.len() > 1 && violation.is_none() {
            violation = Some((t, acting));
        }
    }
    let end: Vec<usize> = sims
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.killed && s.e.may_act(s.mono(until)))
        .map(|(i, _)| i)
        .collect();
    (violation, end)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Never two at once; after the faults, one manager in charge within two lease periods.
    #[test]
    fn never_two_managers_in_charge(seed in any::<u64>(), managers in 1usize..5) {
        let faults_end = 300.0;
        let (violation, end) = simulate(seed, managers, faults_end + 2.0 * D + 5.0, faults_end);
        prop_assert!(violation.is_none(), "two in charge: {violation:?}");
        prop_assert_eq!(end.len(), 1, "after the faults: {:?}", end);
    }
}

/// The file store's compare-and-swap, on a real directory: one create wins, a replace of a
/// version that is gone loses, a file that is no lease is an error that names it.
#[tokio::test]
async fn the_lease_file_is_a_compare_and_swap() {
    use super::file::FileStore;
    use super::Store;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared/manager.lease");
    let a = FileStore::new(&path, "a").unwrap();
    let b = FileStore::new(&path, "b").unwrap();
    assert_eq!(a.describe(), format!("file:{}", path.display()));
    let empty = b.read().await.unwrap();
    assert_eq!(empty.record, None);
    assert!(a.write(&Write::Create(rec("a", 0))).await.unwrap());
    assert!(
        !b.write(&Write::Create(rec("b", 0))).await.unwrap(),
        "one create wins"
    );
    let read = b.read().await.unwrap();
    assert_eq!(read.record.as_ref().map(|r| r.holder.as_str()), Some("a"));
    let v = read.version.clone().unwrap();
    // `a` renews: the version `b` read is gone.
    assert!(a
        .write(&Write::Replace {
            record: rec("a", 0),
            version: v.clone()
        })
        .await
        .unwrap());
    assert!(!b
        .write(&Write::Replace {
            record: rec("b", 1),
            version: v
        })
        .await
        .unwrap());
    let now = b.read().await.unwrap();
    assert_eq!(now.record.unwrap().holder, "a");
    // No lock file or claim is left behind.
    let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["manager.lease"], "{names:?}");
    std::fs::write(&path, "not json").unwrap();
    let e = a.read().await.unwrap_err().to_string();
    assert!(e.contains("manager.lease: not a lease file"), "{e}");
}
