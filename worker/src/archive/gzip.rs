//! The gzip stream of an archive: the input is cut into blocks of 4 × 65,535 bytes, each deflated
//! on its own on one of `threads` threads (pigz's independent blocks, each ended by a sync flush so
//! that they join into one deflate stream and one gzip member), and written in order. A block
//! whose bytes are close to random is stored instead: the entropy of its byte counts says so
//! before any deflating, or a deflate that does not shrink it by 2 % after. Deflating random
//! data costs about 15 ns a byte here and makes it 5 % bigger (zlib-rs's level 1, which the
//! server's gunzip then reads back). The CRC-32 of the whole stream is combined from the blocks'.
//!
//! A block is gathered in the layout of stored deflate blocks: a 5-byte gap before each 65,535
//! bytes of input. A file's bytes are read straight into it ([`ReadInto`]), and a stored block
//! goes out as it was gathered, its headers written into the gaps and the buffer handed to the
//! [`Sink`] whole: between the read that brings a byte in and the send that takes it to the
//! socket, no byte of a stored block is copied. A deflated block is read around the gaps.
//!
//! Written here rather than taken from `gzp`: its compressors use one level for the whole
//! stream, and with it a results tree of checkpoints or media went up at a fifth of what the
//! link carries.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flate2::{Compress, Compression, FlushCompress};

use crate::nofollow::archive::ReadInto;

/// Most bytes of one stored deflate block.
const PIECE: usize = 65_535;
/// Stored deflate blocks' worth of input in one block.
const PIECES: usize = 4;
/// Bytes of input deflated apart (256 KiB less 4 bytes): few enough blocks that handing them
/// between threads costs little.
pub const BLOCK: usize = PIECES * PIECE;
/// A stored block's header: a byte of block type 00, then LEN and its one's complement NLEN.
const GAP: usize = 5;
/// A full block as gathered: each piece behind the gap for its header.
const FRAME: usize = BLOCK + PIECES * GAP;
/// Bits of entropy per byte above which a block is stored without trying to deflate it
/// (Huffman coding could save under 2.5 %).
const STORE_ENTROPY: f64 = 7.8;
/// gzip's header: deflate, no name, no time, unknown OS.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
/// The last, empty block of the deflate stream (fixed Huffman codes, end of block).
const LAST_BLOCK: [u8; 2] = [0x03, 0x00];

/// Where the gzip stream goes: bytes, and whole buffers handed over as they are.
pub trait Sink: Write {
    /// Writes all of `buf`; a sink that can keep the buffer takes it without a copy.
    fn write_owned(&mut self, buf: Vec<u8>) -> io::Result<()> {
        self.write_all(&buf)
    }
}

impl Sink for Vec<u8> {}

/// Up to [`BLOCK`] bytes of input, in the layout of stored blocks (a gap before each piece).
struct Block {
    buf: Vec<u8>,
    /// Bytes of input in it.
    len: usize,
}

impl Block {
    fn new() -> Self {
        Block {
            buf: vec![0; FRAME],
            len: 0,
        }
    }

    /// Where the input's byte `k` lies in `buf`.
    fn at(k: usize) -> usize {
        k + GAP * (1 + k / PIECE)
    }

    /// The room left in the current piece (empty when the block is full).
    fn spare(&mut self) -> &mut [u8] {
        if self.len == BLOCK {
            return &mut [];
        }
        let end = (self.len / PIECE + 1) * PIECE;
        let start = Self::at(self.len);
        &mut self.buf[start..start + (end - self.len)]
    }

    /// The input, piece by piece.
    fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len.div_ceil(PIECE)).map(move |i| {
            let (from, to) = (i * PIECE, self.len.min((i + 1) * PIECE));
            &self.buf[Self::at(from)..Self::at(from) + (to - from)]
        })
    }

    /// The block as stored deflate blocks, not final: each piece behind its header.
    fn into_stored(mut self) -> Vec<u8> {
        let pieces = self.len.div_ceil(PIECE);
        for i in 0..pieces {
            let n = (self.len.min((i + 1) * PIECE) - i * PIECE) as u16;
            let [a, b] = n.to_le_bytes();
            let [c, d] = (!n).to_le_bytes();
            let h = Self::at(i * PIECE) - GAP;
            self.buf[h..h + GAP].copy_from_slice(&[0, a, b, c, d]);
        }
        let end = if self.len == 0 {
            0
        } else {
            Self::at(self.len - 1) + 1
        };
        self.buf.truncate(end);
        self.buf
    }
}

/// A block as it goes out, and what the trailer needs of it.
struct Done {
    out: Vec<u8>,
    crc: crc32fast::Hasher,
    len: usize,
}

type Job = (Block, SyncSender<Done>);

/// A `Write` that gzips into `W` on its own threads; [`GzWriter::finish`] ends the stream and
/// returns `W`. Dropped without `finish` (the archive failed), it writes no trailer, so what
/// was sent cannot pass for a whole archive. A failing `W` fails the next write with its own
/// error.
pub struct GzWriter<W: Sink + Send + 'static> {
    block: Block,
    jobs: Option<SyncSender<Job>>,
    order: Option<SyncSender<Receiver<Done>>>,
    compressors: Vec<JoinHandle<()>>,
    writer: Option<JoinHandle<io::Result<W>>>,
    finished: Arc<AtomicBool>,
}

impl<W: Sink + Send + 'static> GzWriter<W> {
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
                        let Ok((block, done)) = job else { return };
                        // The writer may be gone (it failed): nothing to do then.
                        let _ = done.send(deflate_block(block));
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
            block: Block::new(),
            jobs: Some(jobs),
            order: Some(order),
            compressors,
            writer: Some(writer),
            finished,
        })
    }

    /// Hands the gathered block to the compressors.
    fn send(&mut self) -> io::Result<()> {
        let block = std::mem::replace(&mut self.block, Block::new());
        let (tx, rx) = sync_channel(1);
        let sent = match (&self.order, &self.jobs) {
            (Some(order), Some(jobs)) => order.send(rx).is_ok() && jobs.send((block, tx)).is_ok(),
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

    /// Counts `n` bytes just put into the block's spare room, and sends it once full.
    fn advance(&mut self, n: usize) -> io::Result<()> {
        self.block.len += n;
        if self.block.len == BLOCK {
            self.send()?;
        }
        Ok(())
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
        if self.block.len > 0 {
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

impl<W: Sink + Send + 'static> Write for GzWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let spare = self.block.spare();
        let n = spare.len().min(data.len());
        spare[..n].copy_from_slice(&data[..n]);
        self.advance(n)?;
        Ok(n)
    }

    /// Blocks are deflated whole: nothing to push before the end.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Sink + Send + 'static> ReadInto for GzWriter<W> {
    /// Reads `r` to its end straight into the blocks, a piece (64 KiB) a read at most.
    fn read_into(&mut self, r: &mut dyn Read) -> io::Result<u64> {
        let mut total = 0;
        loop {
            let n = match r.read(self.block.spare()) {
                Ok(0) => return Ok(total),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            total += n as u64;
            self.advance(n)?;
        }
    }
}

impl<W: Sink + Send + 'static> Drop for GzWriter<W> {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// The writer thread: the header, each block as soon as it and those before it are done, and,
/// once `finished`, the last block and the trailer (CRC-32 and length mod 2^32).
fn write_in_order<W: Sink>(
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
        crc.combine(&done.crc);
        len += done.len as u64;
        out.write_owned(done.out)?;
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
fn deflate_block(block: Block) -> Done {
    let mut crc = crc32fast::Hasher::new();
    for p in block.pieces() {
        crc.update(p);
    }
    let len = block.len;
    let out = if entropy(block.pieces()) > STORE_ENTROPY {
        block.into_stored()
    } else {
        let d = deflate(&block, 1);
        if d.len() > len - len / 50 {
            block.into_stored()
        } else {
            d
        }
    };
    Done { out, crc, len }
}

/// A raw deflate of the block's input on its own (no earlier window), ended by a sync flush:
/// byte-aligned and not final, so that blocks join.
fn deflate(block: &Block, level: u32) -> Vec<u8> {
    let mut c = Compress::new(Compression::new(level), false);
    // Room for a little growth and the flush's empty block.
    let mut out = Vec::with_capacity(block.len + block.len / 4096 + 64);
    let pieces: Vec<&[u8]> = block.pieces().collect();
    for (i, piece) in pieces.iter().enumerate() {
        let flush = if i + 1 == pieces.len() {
            FlushCompress::Sync
        } else {
            FlushCompress::None
        };
        let start = c.total_in();
        loop {
            let read = (c.total_in() - start) as usize;
            c.compress_vec(&piece[read..], &mut out, flush)
                .expect("deflate of a buffer in memory");
            // All read, and room left after the flush: done with this piece.
            if (c.total_in() - start) as usize == piece.len() && out.len() < out.capacity() {
                break;
            }
            out.reserve(64 * 1024);
        }
    }
    out
}

/// Every how many bytes one is counted for the entropy: 8 Ki of a full block, enough to tell
/// random bytes (about 7.97 bits counted so) from anything that deflates (text: under 5).
const SAMPLE_EVERY: usize = 32;

/// Shannon entropy of the byte counts of the input (every [`SAMPLE_EVERY`]th byte of each
/// piece), in bits per byte.
fn entropy<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> f64 {
    let mut counts = [0u32; 256];
    let mut n = 0u32;
    for p in pieces {
        for &b in p.iter().step_by(SAMPLE_EVERY) {
            counts[b as usize] += 1;
            n += 1;
        }
    }
    if n == 0 {
        return 0.0;
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

    /// Gives at most `max` bytes a read, fewer every other time.
    struct Trickle<'a>(&'a [u8], usize, bool);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.2 = !self.2;
            let want = if self.2 { self.1 } else { self.1 / 3 + 1 };
            let n = buf.len().min(want).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn reads_straight_into_the_blocks_give_the_same_stream_as_writes() {
        let mut data = noise(PIECE - 1);
        data.extend("text\n".repeat(PIECE / 5 + 7).bytes());
        data.extend(noise(BLOCK + 3));
        for len in [
            0,
            1,
            PIECE - 1,
            PIECE,
            PIECE + 1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            data.len(),
        ] {
            let data = &data[..len];
            for max in [1, 4096, PIECE + 9, 10 * BLOCK] {
                let mut w = GzWriter::new(Vec::new(), 2).unwrap();
                w.write_all(b"head").unwrap();
                assert_eq!(
                    w.read_into(&mut Trickle(data, max, false)).unwrap(),
                    len as u64
                );
                w.write_all(b"tail").unwrap();
                let gz = w.finish().unwrap();
                let mut want = b"head".to_vec();
                want.extend_from_slice(data);
                want.extend_from_slice(b"tail");
                assert_eq!(gunzip(&gz), want, "{len} bytes read {max} at a time");
                assert_eq!(gz, gzip(&want, 1, 1000), "{len} bytes read {max} at a time");
            }
        }
    }

    #[test]
    fn a_stored_block_goes_to_the_sink_as_it_was_gathered() {
        /// Records the length of each buffer handed over whole.
        #[derive(Default)]
        struct Owned(Vec<u8>, Vec<usize>);
        impl Write for Owned {
            fn write(&mut self, d: &[u8]) -> io::Result<usize> {
                self.0.extend_from_slice(d);
                Ok(d.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        impl Sink for Owned {
            fn write_owned(&mut self, buf: Vec<u8>) -> io::Result<()> {
                self.1.push(buf.len());
                self.0.extend_from_slice(&buf);
                Ok(())
            }
        }
        let random = noise(3 * BLOCK + 100);
        let mut w = GzWriter::new(Owned::default(), 2).unwrap();
        w.read_into(&mut &random[..]).unwrap();
        let out = w.finish().unwrap();
        // Three full blocks, each piece behind its header; the last block is 100 bytes.
        assert_eq!(out.1, [FRAME, FRAME, FRAME, 100 + GAP]);
        assert_eq!(gunzip(&out.0), random);
    }

    #[test]
    fn random_blocks_are_stored_and_text_deflated() {
        let random = noise(4 * BLOCK);
        let gz = gzip(&random, 2, BLOCK);
        // Stored: 5 bytes a 64 KiB block, a flush a block, header and trailer.
        assert!(gz.len() < random.len() + 200, "{} bytes", gz.len());
        assert!(entropy(std::iter::once(&random[..])) > STORE_ENTROPY);
        let text = "results line 42\n".repeat(50_000).into_bytes();
        assert!(gzip(&text, 2, BLOCK).len() < text.len() / 10);
        assert!(entropy(std::iter::once(&text[..])) < STORE_ENTROPY);
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
        impl Sink for Broken {}
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
        impl Sink for Shared {}
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
