//! File summaries: head and tail lines of a text file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

pub const NONE_PLACEHOLDER: &str = "<none>";
pub const BINARY_PLACEHOLDER: &str = "<binary>";

/// Python's `str.splitlines(keepends=True)`.
pub(super) fn split_lines(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let end = match c {
            '\r' => match it.peek() {
                Some((_, '\n')) => {
                    it.next();
                    i + 2
                }
                _ => i + 1,
            },
            '\n' | '\x0b' | '\x0c' | '\x1c' | '\x1d' | '\x1e' | '\u{85}' | '\u{2028}'
            | '\u{2029}' => i + c.len_utf8(),
            _ => continue,
        };
        out.push(s[start..end].to_owned());
        start = end;
    }
    if start < s.len() {
        out.push(s[start..].to_owned());
    }
    out
}

/// Text of `bytes` as Python's text mode reads it (UTF-8, universal newlines); `None` if it is
/// not UTF-8. An incomplete character at the end is dropped when `more` (the file goes on).
pub(super) fn decode(bytes: &[u8], more: bool) -> Option<String> {
    let text = match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) if more && e.error_len().is_none() => {
            std::str::from_utf8(&bytes[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    let mut text = text.replace("\r\n", "\n");
    // A '\r' ending the buffer may be the first half of a "\r\n" pair.
    let held = more && text.ends_with('\r');
    if held {
        text.pop();
    }
    let mut text = text.replace('\r', "\n");
    if held {
        text.push('\n');
    }
    Some(text)
}

pub(super) fn ends_with_newline(lines: &mut Vec<String>, drop_partial: bool) {
    if let Some(last) = lines.last_mut() {
        if !last.ends_with('\n') {
            if drop_partial {
                lines.pop();
            } else {
                last.push('\n');
            }
        }
    }
}

/// The most bytes a summary reads from each end of a file, whatever lines are asked for: a
/// `cl cat --head 100000000` of a 1 GiB file once read it whole into the worker's memory, and
/// copied it several times (3.1 GB).
pub const MAX_SUMMARY_END: u64 = 4 << 20;

/// CodaLab's file summary: the first `head` and last `tail` lines with `truncation` between
/// them when lines were left out. A large file is read only near its ends (`lines ×
/// max_line_length` characters each, at most [`MAX_SUMMARY_END`] bytes each: the lines asked
/// for that do not fit are left out, as the middle of the file is); `<binary>` if the text read
/// is not UTF-8.
pub fn summarize(
    file: &mut File,
    head: u64,
    tail: u64,
    max_line_length: u64,
    truncation: &str,
) -> io::Result<String> {
    let size = file.metadata()?.len();
    let (h, t) = (head as usize, tail as usize);
    let whole =
        size <= (head + tail).saturating_mul(max_line_length) && size <= 2 * MAX_SUMMARY_END;
    let lines = if !whole {
        let mut head_lines = Vec::new();
        let mut tail_lines = Vec::new();
        if head > 0 {
            // Read enough bytes for head × max_line_length characters, then cut at that count.
            let chars = head.saturating_mul(max_line_length);
            let want = chars
                .saturating_mul(4)
                .saturating_add(1)
                .min(size)
                .min(MAX_SUMMARY_END);
            let mut buf = Vec::new();
            file.seek(SeekFrom::Start(0))?;
            (&mut *file).take(want).read_to_end(&mut buf)?;
            let Some(text) = decode(&buf, (buf.len() as u64) < size) else {
                return Ok(BINARY_PLACEHOLDER.into());
            };
            let cut = text
                .char_indices()
                .nth(chars.min(usize::MAX as u64) as usize)
                .map_or(text.len(), |(i, _)| i);
            head_lines = split_lines(&text[..cut]);
            head_lines.truncate(h);
            ends_with_newline(&mut head_lines, true);
        }
        if tail > 0 {
            // One byte more than needed: the first (partial) line is always dropped.
            let span = tail
                .saturating_mul(max_line_length)
                .saturating_add(1)
                .min(size)
                .min(MAX_SUMMARY_END);
            let mut buf = Vec::new();
            file.seek(SeekFrom::Start(size - span))?;
            (&mut *file).take(span).read_to_end(&mut buf)?;
            // Starting inside a multi-byte character only cuts the line dropped anyway.
            let skip = buf
                .iter()
                .take(3)
                .take_while(|&&c| c & 0xC0 == 0x80)
                .count();
            let Some(text) = decode(&buf[skip..], false) else {
                return Ok(BINARY_PLACEHOLDER.into());
            };
            let mut all = split_lines(&text);
            if !all.is_empty() {
                all.remove(0);
            }
            tail_lines = all.split_off(all.len().saturating_sub(t));
            ends_with_newline(&mut tail_lines, false);
        }
        if head > 0 && tail > 0 {
            head_lines.push(truncation.to_owned());
            head_lines.extend(tail_lines);
            head_lines
        } else if head > 0 {
            head_lines
        } else {
            tail_lines
        }
    } else {
        let mut buf = Vec::new();
        file.seek(SeekFrom::Start(0))?;
        (&mut *file).take(size).read_to_end(&mut buf)?;
        let Some(text) = decode(&buf, false) else {
            return Ok(BINARY_PLACEHOLDER.into());
        };
        let mut lines = split_lines(&text);
        ends_with_newline(&mut lines, false);
        if lines.len() > h + t {
            if head > 0 && tail > 0 {
                let mut tail_part = lines.split_off(lines.len() - t);
                lines.truncate(h);
                lines.push(truncation.to_owned());
                lines.append(&mut tail_part);
                lines
            } else if head > 0 {
                lines.truncate(h);
                lines
            } else {
                lines.split_off(lines.len() - t)
            }
        } else {
            lines
        }
    };
    Ok(lines.concat())
}
