//! Slurm hostlist expansion (`SLURM_JOB_NODELIST`, `SLURM_TASKS_PER_NODE`).
//!
//! Slurm never gives a process `MASTER_ADDR`; it gives a *compressed* node list such as
//! `gnode[10,20,25,37]` or `r[1-2]n[01-04]-ib`, and every tool that runs under Slurm has to expand
//! it itself (DINOv2's hand-written expander broke on `node1,node2` and `n[1-2]-ib`). This module
//! is that expander. It follows the grammar of Slurm's own `hostlist_create` /
//! `scontrol show hostnames`:
//!
//! * hosts are separated by `,` or whitespace; a comma inside brackets belongs to the range;
//! * `prefix[a-b,c]suffix`, with any number of bracket groups in one host, expanded left to right
//!   with the leftmost group varying slowest (`r[1-2]n[1-2]` -> `r1n1,r1n2,r2n1,r2n2`);
//! * zero padding: the field width is the length of the written low bound, as in Slurm
//!   (`node[01-04]` -> `node01`..`node04`, `n[8-11]` -> `n8`..`n11`, `n[098-100]` -> `n098`..`n100`);
//! * order is kept and duplicates are not removed (Slurm does not remove them either).
//!
//! Every error says what text was wrong and where (byte offset into the input), and the total
//! number of hosts is capped by [`MAX_EXPANDED_HOSTS`] so that `n[0-999999999]` is an error, not
//! an out-of-memory kill.
//!
//! The `hostlist-parser` crate (0.1.6) was tried first and dropped: it joins whitespace-separated
//! hosts (`"a b"` -> `"ab"`), silently accepts reversed ranges (`[5-3]` counts down), removes
//! duplicates, rejects `_` in host names, has no expansion limit, and reports combine parser
//! errors rather than typed ones.

use thiserror::Error;

/// The most hosts (or task counts) one expansion may produce. Larger lists are refused before
/// anything is allocated: no real Slurm job has a million nodes, and `n[0-999999999]` would
/// otherwise need tens of gigabytes.
pub const MAX_EXPANDED_HOSTS: usize = 1 << 20;

/// Why a hostlist (or a `SLURM_TASKS_PER_NODE` value) could not be expanded. Positions are byte
/// offsets into `input`, counted from 0.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostlistError {
    /// The input held no host at all (empty, or only separators).
    #[error("empty hostlist `{input}`: expected one or more host names such as `node1,node2` or `node[01-04]`")]
    Empty { input: String },

    /// A `[` never closed, a `]` never opened, or a `[` inside brackets.
    #[error("unbalanced brackets in hostlist `{input}` at position {position}: {detail}")]
    UnbalancedBrackets { input: String, position: usize, detail: &'static str },

    /// `[]`, or an empty element between commas inside brackets (`[1,,2]`, `[1,]`).
    #[error(
        "empty range in hostlist `{input}` at position {position}: expected a number or a range `a-b` inside the brackets"
    )]
    EmptyRange { input: String, position: usize },

    /// A range whose low bound is above its high bound (`[5-3]`).
    #[error(
        "reversed range `{range}` in hostlist `{input}` at position {position}: low bound {lo} is greater than high bound {hi}; write it as `{hi}-{lo}`"
    )]
    ReversedRange { input: String, position: usize, range: String, lo: u64, hi: u64 },

    /// A range element that is not `digits` or `digits-digits` (`[a-b]`, `[1-]`, `[1-2-3]`, `[ 1]`).
    #[error(
        "non-numeric range `{range}` in hostlist `{input}` at position {position}: expected a non-negative integer such as `7` or a range such as `01-04`"
    )]
    NonNumericRange { input: String, position: usize, range: String },

    /// A range bound with more digits than fit in 64 bits.
    #[error("number `{number}` in hostlist `{input}` at position {position} is too large: expected at most {max}", max = u64::MAX)]
    NumberTooLarge { input: String, position: usize, number: String },

    /// The expansion would produce more than [`MAX_EXPANDED_HOSTS`] entries; `text` is the host
    /// (or tasks-per-node element) at which the limit was crossed.
    #[error(
        "hostlist `{input}` expands to more than {limit} entries (MAX_EXPANDED_HOSTS), the limit is crossed at `{text}` at position {position}"
    )]
    TooManyHosts { input: String, position: usize, text: String, limit: usize },

    /// A `SLURM_TASKS_PER_NODE` element that is not `N` or `N(xK)`.
    #[error(
        "invalid tasks-per-node element `{element}` in `{input}` at position {position}: expected `N` or `N(xK)` with non-negative integers N and K >= 1, such as `2(x3),1`"
    )]
    InvalidTasksPerNode { input: String, position: usize, element: String },
}

/// Expands a Slurm hostlist such as `node[01-04,07],gpu[1-2]-ib login1` into host names, in
/// order, without removing duplicates. See the module documentation for the grammar.
pub fn expand(list: &str) -> Result<Vec<String>, HostlistError> {
    let mut out = Vec::new();
    // Byte offset of the `[` currently open, if any.
    let mut open: Option<usize> = None;
    // Byte offset where the current host started, if one has started.
    let mut start: Option<usize> = None;

    for (i, c) in list.char_indices() {
        match c {
            '[' => {
                if open.is_some() {
                    return Err(HostlistError::UnbalancedBrackets {
                        input: list.to_owned(),
                        position: i,
                        detail: "`[` inside an open bracket (brackets do not nest)",
                    });
                }
                open = Some(i);
                start.get_or_insert(i);
            }
            ']' => {
                if open.is_none() {
                    return Err(HostlistError::UnbalancedBrackets {
                        input: list.to_owned(),
                        position: i,
                        detail: "`]` without a matching `[`",
                    });
                }
                open = None;
            }
            c if open.is_none() && (c == ',' || c.is_whitespace()) => {
                if let Some(s) = start.take() {
                    expand_host(list, s, i, &mut out)?;
                }
            }
            _ => {
                start.get_or_insert(i);
            }
        }
    }
    if let Some(position) = open {
        return Err(HostlistError::UnbalancedBrackets {
            input: list.to_owned(),
            position,
            detail: "`[` is never closed",
        });
    }
    if let Some(s) = start {
        expand_host(list, s, list.len(), &mut out)?;
    }
    if out.is_empty() {
        return Err(HostlistError::Empty { input: list.to_owned() });
    }
    Ok(out)
}

/// One numeric range inside brackets: `lo..=hi`, printed zero-padded to `width` digits.
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: u64,
    hi: u64,
    width: usize,
}

impl Range {
    /// Number of values, or `None` if it does not fit in a u64 (`0-18446744073709551615`).
    fn len(&self) -> Option<u64> {
        (self.hi - self.lo).checked_add(1)
    }
}

enum Segment<'a> {
    Literal(&'a str),
    /// The comma-separated ranges of one bracket group, in written order.
    Group(Vec<Range>),
}

/// Expands the single host `input[start..end]` (brackets already known to be balanced and
/// unnested) and appends the results to `out`, refusing to grow `out` past
/// [`MAX_EXPANDED_HOSTS`].
fn expand_host(input: &str, start: usize, end: usize, out: &mut Vec<String>) -> Result<(), HostlistError> {
    let host = &input[start..end];
    let mut segments = Vec::new();
    let mut rest_start = start;
    while rest_start < end {
        let rest = &input[rest_start..end];
        match rest.find('[') {
            None => {
                segments.push(Segment::Literal(rest));
                break;
            }
            Some(rel_open) => {
                if rel_open > 0 {
                    segments.push(Segment::Literal(&rest[..rel_open]));
                }
                let open = rest_start + rel_open;
                // The tokenizer guarantees a matching `]` inside this host.
                let close = match input[open..end].find(']') {
                    Some(rel) => open + rel,
                    None => {
                        return Err(HostlistError::UnbalancedBrackets {
                            input: input.to_owned(),
                            position: open,
                            detail: "`[` is never closed",
                        });
                    }
                };
                segments.push(Segment::Group(parse_group(input, open + 1, close)?));
                rest_start = close + 1;
            }
        }
    }

    // Count before allocating anything.
    let too_many = || HostlistError::TooManyHosts {
        input: input.to_owned(),
        position: start,
        text: host.to_owned(),
        limit: MAX_EXPANDED_HOSTS,
    };
    let mut count: u64 = 1;
    for seg in &segments {
        if let Segment::Group(ranges) = seg {
            let mut group_len: u64 = 0;
            for r in ranges {
                group_len = r.len().and_then(|l| group_len.checked_add(l)).ok_or_else(too_many)?;
            }
            count = count.checked_mul(group_len).ok_or_else(too_many)?;
        }
    }
    let total = (out.len() as u64).checked_add(count).ok_or_else(too_many)?;
    if total > MAX_EXPANDED_HOSTS as u64 {
        return Err(too_many());
    }

    // Cartesian product, leftmost group varying slowest.
    let mut partial: Vec<String> = vec![String::new()];
    for seg in &segments {
        match seg {
            Segment::Literal(text) => {
                for p in &mut partial {
                    p.push_str(text);
                }
            }
            Segment::Group(ranges) => {
                let mut next = Vec::new();
                for p in &partial {
                    for r in ranges {
                        for n in r.lo..=r.hi {
                            next.push(format!("{p}{n:0width$}", width = r.width));
                        }
                    }
                }
                partial = next;
            }
        }
    }
    out.extend(partial);
    Ok(())
}

/// Parses the inside of one bracket group, `input[start..end]` (between `[` and `]`).
fn parse_group(input: &str, start: usize, end: usize) -> Result<Vec<Range>, HostlistError> {
    let mut ranges = Vec::new();
    let mut elem_start = start;
    loop {
        let elem_end = input[elem_start..end].find(',').map_or(end, |rel| elem_start + rel);
        ranges.push(parse_range(input, elem_start, elem_end)?);
        if elem_end == end {
            return Ok(ranges);
        }
        elem_start = elem_end + 1;
    }
}

/// Parses one range element `input[start..end]`: `N` or `LO-HI`.
fn parse_range(input: &str, start: usize, end: usize) -> Result<Range, HostlistError> {
    let elem = &input[start..end];
    if elem.is_empty() {
        return Err(HostlistError::EmptyRange { input: input.to_owned(), position: start });
    }
    let non_numeric =
        || HostlistError::NonNumericRange { input: input.to_owned(), position: start, range: elem.to_owned() };
    let (lo_text, hi_text, hi_pos) = match elem.split_once('-') {
        Some((lo, hi)) => (lo, hi, start + lo.len() + 1),
        None => (elem, elem, start),
    };
    let is_number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !is_number(lo_text) || !is_number(hi_text) {
        return Err(non_numeric());
    }
    let parse = |s: &str, position: usize| {
        s.parse::<u64>().map_err(|_| HostlistError::NumberTooLarge {
            input: input.to_owned(),
            position,
            number: s.to_owned(),
        })
    };
    let lo = parse(lo_text, start)?;
    let hi = parse(hi_text, hi_pos)?;
    if lo > hi {
        return Err(HostlistError::ReversedRange {
            input: input.to_owned(),
            position: start,
            range: elem.to_owned(),
            lo,
            hi,
        });
    }
    Ok(Range { lo, hi, width: lo_text.len() })
}

/// Expands Slurm's compressed per-node task counts (`SLURM_TASKS_PER_NODE`,
/// `SLURM_NTASKS_PER_NODE`): `2(x3),1` -> `[2, 2, 2, 1]`. Elements are `N` or `N(xK)`, separated
/// by commas; surrounding whitespace is ignored. The result is capped at [`MAX_EXPANDED_HOSTS`]
/// entries, since there is one entry per node.
pub fn expand_tasks_per_node(s: &str) -> Result<Vec<u32>, HostlistError> {
    if s.trim().is_empty() {
        return Err(HostlistError::Empty { input: s.to_owned() });
    }
    let mut out = Vec::new();
    let mut elem_start = 0;
    loop {
        let elem_end = s[elem_start..].find(',').map_or(s.len(), |rel| elem_start + rel);
        let raw = &s[elem_start..elem_end];
        let lead = raw.len() - raw.trim_start().len();
        let elem = raw.trim();
        let position = elem_start + lead;
        let invalid = || HostlistError::InvalidTasksPerNode { input: s.to_owned(), position, element: elem.to_owned() };
        let (tasks_text, repeat_text) = match elem.strip_suffix(')') {
            Some(head) => match head.split_once("(x") {
                Some((n, k)) => (n, Some(k)),
                None => return Err(invalid()),
            },
            None => (elem, None),
        };
        let is_number = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !is_number(tasks_text) {
            return Err(invalid());
        }
        let tasks: u32 = tasks_text.parse().map_err(|_| invalid())?;
        let repeat: u64 = match repeat_text {
            None => 1,
            Some(k) if is_number(k) => match k.parse::<u64>() {
                Ok(k) if k >= 1 => k,
                _ => return Err(invalid()),
            },
            Some(_) => return Err(invalid()),
        };
        let total = (out.len() as u64).saturating_add(repeat);
        if total > MAX_EXPANDED_HOSTS as u64 {
            return Err(HostlistError::TooManyHosts {
                input: s.to_owned(),
                position,
                text: elem.to_owned(),
                limit: MAX_EXPANDED_HOSTS,
            });
        }
        // `repeat` <= MAX_EXPANDED_HOSTS here, so it fits in usize.
        out.extend(std::iter::repeat_n(tasks, repeat as usize));
        if elem_end == s.len() {
            return Ok(out);
        }
        elem_start = elem_end + 1;
    }
}

#[cfg(test)]
mod tests;
