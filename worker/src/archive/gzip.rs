//! The gzip stream of an archive: the input is cut into blocks of 128 KiB, each deflated on its
//! own on one of `threads` threads (pigz's independent blocks, each ended by a sync flush so
//! that they join into one deflate stream and one gzip member), and written in order. A block
//! whose bytes are close to random is stored instead: the entropy of its byte counts says so
//! before any deflating, or a deflate that does not shrink it by 2 % after. Deflating random
//! data costs about 15 ns a byte here and makes it 5 % bigger (zlib-rs's level 1, which the
//! server's gunzip then reads back). A stored block goes out as it came in, behind its stored
//! blocks' 5-byte headers (no copy through zlib), and its entropy is read from every 8th byte.
//! The CRC-32 of the whole stream is combined from the blocks'.
//!
//! Written here rather than taken from `gzp`: its compressors use one level for the whole
//! stream, and with it a results tree of checkpoints or media went up at a fifth of what the
//! link carries.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flate2::{Compress, Compression, FlushCompress};

/// Bytes deflated apart.
pub const BLOCK: usize = 128 * 1024;
/// Bits of entropy per byte above which a block is stored without trying to deflate it
/// (Huffman coding could save under 2.5 %).
const STORE_ENTROPY: f64 = 7.8;
/// gzip's header: deflate, no name, no time, unknown OS.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
/// The last, empty block of the deflate stream (fixed Huffman codes, end of block).
const LAST_BLOCK: [u8; 2] = [0x03, 0x00];

/// A block as it goes out, and what the trailer needs of it.
struct Done {
    out: Out,
    crc: crc32fast::Hasher,
    len: usize,
}

enum Out {
    /// Deflated, ended by a sync flush.
    Deflated(Vec<u8>),
    /// The input itself, to go out in stored blocks.
    Stored(Vec<u8>),
}

/// Most bytes of one stored deflate block.
const STORED_MAX: usize = 65_535;

/// Writes `data` as stored deflate blocks, not final, starting on a byte boundary (each block
/// before ended on one): a byte of block type 00, then LEN and its one's complement NLEN.
fn write_stored<W: Write>(out: &mut W, data: &[u8]) -> io::Result<()> {
    for piece in data.chunks(STORED_MAX) {
        let n = piece.len() as u16;
        let [a, b] = n.to_le_bytes();
        let [c, d] = (!n).to_le_bytes();
        out.write_all(&[0, a, b, c, d])?;
        out.write_all(piece)?;
    }
    Ok(())
}

type Job = (Vec<u8>, SyncSender<Done>);

/// A `Write` that gzips into `W` on its own threads; [`GzWriter::finish`] ends the stream and
/// returns `W`. Dropped without `finish` (the archive failed), it writes no trailer, so what
/// was sent cannot pass for a whole archive. A failing `W` fails the next write with its own
/// error.
pub struct GzWriter<W: Write + Send + 'static> {
    buf: Vec<u8>,
    jobs: Option<SyncSender<Job>>,
    order: Option<SyncSender<Receiver<Done>>>,
    compressors: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<io::Result<W>>>,
    finished: Arc<AtomicBool>,
}

impl<W: Write + Send + 'static> GzWriter<W> {
    /// Gzips into `out` on `threads` compression threads (at least one) and one writer thread.
    pub fn new(out: W, threads: usize) -> io::Result<Self> {
        let threads = threads.max(1);
        let (jobs, jobs_rx) = sync_channel::<Job>(threads);
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let mut compressors = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx = jobs_rx.clone();
            compressors.push(
                std::thread::Builder::new()
                    .name(format!("gzip-{i}"))
                    .spawn(move || loop {
                        let job = rx.lock().map_err(drop).and_then(|r| r.recv().map_err(drop));
                        let Ok((data, done)) = job else { return };
                        // The writer may be gone (it failed): nothing to do then.
                        let _ = done.send(deflate_block(data));
                    })?,
            );
        }
        let (order, order_rx) = sync_channel::<Receiver<Done>>(2 * threads);
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        let writer = std::thread::Builder::new()
            .name("gzip-out".into())
            .spawn(move || write_in_order(out, order_rx, &done))?;
        Ok(GzWriter {
            buf: Vec::with_capacity(BLOCK),
            jobs: Some(jobs),
            order: Some(order),
            compressors,
            writer: Some(writer),
            finished,
        })
    }

    /// Hands the buffered block to the compressors.
    fn send(&mut self) -> io::Result<()> {
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK));
        let (tx, rx) = sync_channel(1);
        let sent = match (&self.order, &self.jobs) {
            (Some(order), Some(jobs)) => order.send(rx).is_ok() && jobs.send((data, tx)).is_ok(),
            _ => false,
        };
        if sent {
            return Ok(());
        }
        // The writer stopped: its error is the cause.
        Err(match self.writer.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => e,
            _ => io::Error::new(io::ErrorKind::BrokenPipe, "the archive's writer stopped"),
        })
    }

    /// Stops the threads: the writer ends the stream only when `finished`.
    fn close(&mut self) -> Option<std::thread::Result<io::Result<W>>> {
        self.jobs = None;
        self.order = None;
        for c in self.compressors.drain(..) {
            let _ = c.join();
        }
        self.writer.take().map(JoinHandle::join)
    }

    /// Sends the last block, ends the stream (last block and trailer) and returns `W`.
    pub fn finish(mut self) -> io::Result<W> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        self.finished.store(true, Ordering::SeqCst);
        match self.close() {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(io::Error::other("the archive's writer panicked")),
            None => Err(io::Error::other("the archive's writer stopped")),
        }
    }
}

impl<W: Write + Send + 'static> Write for GzWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = (BLOCK - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == BLOCK {
            self.send()?;
        }
        Ok(n)
    }

    /// Blocks are deflated whole: nothing to push before the end.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Write + Send + 'static> Drop for GzWriter<W> {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The writer thread: the header, each block as soon as it and those before it are done, and,
/// once `finished`, the last block and the trailer (CRC-32 and length mod 2^32).
fn write_in_order<W: Write>(
    mut out: W,
    order: Receiver<Receiver<Done>>,
    finished: &AtomicBool,
) -> io::Result<W> {
    out.write_all(&HEADER)?;
    let mut crc = crc32fast::Hasher::new();
    let mut len: u64 = 0;
    for next in order {
        let done = next
            .recv()
            .map_err(|_| io::Error::other("a gzip thread ended"))?;
        match &done.out {
            Out::Deflated(bytes) => out.write_all(bytes)?,
            Out::Stored(data) => write_stored(&mut out, data)?,
        }
        crc.combine(&done.crc);
        len += done.len as u64;
    }
    if !finished.load(Ordering::SeqCst) {
        return Err(io::Error::other("the archive was abandoned"));
    }
    out.write_all(&LAST_BLOCK)?;
    out.write_all(&crc.finalize().to_le_bytes())?;
    out.write_all(&(len as u32).to_le_bytes())?;
    out.flush()?;
    Ok(out)
}

/// One block, stored when close to random, else deflated (level 1) unless that does not pay.
fn deflate_block(data: Vec<u8>) -> Done {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&data);
    let len = data.len();
    let out = if entropy(&data) > STORE_ENTROPY {
        Out::Stored(data)
    } else {
        let d = deflate(&data, 1);
        if d.len() > len - len / 50 {
            Out::Stored(data)
        } else {
            Out::Deflated(d)
        }
    };
    Done { out, crc, len }
}

/// A raw deflate of `data` on its own (no earlier window), ended by a sync flush: byte-aligned
/// and not final, so that blocks join.
fn deflate(data: &[u8], level: u32) -> Vec<u8> {
    let mut c = Compress::new(Compression::new(level), false);
    // Room for a little growth and the flush's empty block.
    let mut out = Vec::with_capacity(data.len() + data.len() / 4096 + 64);
    loop {
        let read = c.total_in() as usize;
        c.compress_vec(&data[read..], &mut out, FlushCompress::Sync)
            .expect("deflate of a buffer in memory");
        // All read, and room left after the flush: done.
        if c.total_in() as usize == data.len() && out.len() < out.capacity() {
            return out;
        }
        out.reserve(64 * 1024);
    }
}

/// Every how many bytes one is counted for the entropy: 16 Ki of a full block, enough to tell
/// random bytes (about 7.99 bits) from anything that deflates (text: under 5).
const SAMPLE_EVERY: usize = 8;

/// Shannon entropy of the byte counts of `data` (every [`SAMPLE_EVERY`]th byte), in bits per
/// byte.
fn entropy(data: &[u8]) -> f64 {
    if data.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    let mut n = 0u32;
    for &b in data.iter().step_by(SAMPLE_EVERY) {
        counts[b as usize] += 1;
        n += 1;
    }
    let n = f64::from(n);
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn noise(n: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    fn gzip(data: &[u8], threads: usize, piece: usize) -> Vec<u8> {
        let mut w = GzWriter::new(Vec::new(), threads).unwrap();
        for p in data.chunks(piece.max(1)) {
            w.write_all(p).unwrap();
        }
        w.finish().unwrap()
    }

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        // A single-member decoder: a second member would be left unread.
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn any_input_comes_back_from_one_gzip_member() {
        let mut mixed = noise(3 * BLOCK + 17);
        mixed.extend("line of text\n".repeat(40_000).bytes());
        mixed.extend(noise(BLOCK / 3));
        for data in [Vec::new(), b"x".to_vec(), vec![0u8; BLOCK], mixed] {
            for threads in [1, 3] {
                for piece in [1000, BLOCK, 7 * BLOCK] {
                    let gz = gzip(&data, threads, piece);
                    assert_eq!(gunzip(&gz), data, "{} bytes", data.len());
                    // The trailer: CRC-32 and length.
                    let n = gz.len();
                    assert_eq!(gz[n - 8..n - 4], crc32fast::hash(&data).to_le_bytes());
                    assert_eq!(gz[n - 4..], (data.len() as u32).to_le_bytes());
                }
            }
        }
    }

    #[test]
    fn random_blocks_are_stored_and_text_deflated() {
        let random = noise(4 * BLOCK);
        let gz = gzip(&random, 2, BLOCK);
        // Stored: 5 bytes a 64 KiB block, a flush a block, header and trailer.
        assert!(gz.len() < random.len() + 200, "{} bytes", gz.len());
        assert!(entropy(&random) > STORE_ENTROPY);
        let text = "results line 42\n".repeat(50_000).into_bytes();
        assert!(gzip(&text, 2, BLOCK).len() < text.len() / 10);
        assert!(entropy(&text) < STORE_ENTROPY);
    }

    #[test]
    fn a_failing_writer_fails_the_writes_with_its_error_and_a_drop_writes_no_trailer() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::BrokenPipe, "gone"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut w = GzWriter::new(Broken, 2).unwrap();
        let data = noise(64 * BLOCK);
        let e = data
            .chunks(BLOCK)
            .map(|p| w.write_all(p))
            .find_map(Result::err)
            .expect("a write fails");
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(e.to_string(), "gone");

        // Abandoned: the header and blocks, but no last block and no trailer.
        #[derive(Clone, Default)]
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, d: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(d);
                Ok(d.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let out = Shared::default();
        let mut w = GzWriter::new(out.clone(), 2).unwrap();
        w.write_all(&data[..3 * BLOCK]).unwrap();
        drop(w);
        let sent = out.0.lock().unwrap().clone();
        assert!(sent.len() > 3 * BLOCK);
        let mut rest = Vec::new();
        assert!(flate2::read::GzDecoder::new(&sent[..])
            .read_to_end(&mut rest)
            .is_err());
    }
}
