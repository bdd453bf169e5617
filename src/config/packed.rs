//! Sizes of packed blobs without walking their delta chains, for the bound
//! on reading many blobs of one history (`drover log`).
//!
//! [`bounded_blob`](super::bounded_blob) learns a blob's size from libgit2's
//! object header, which follows the blob's whole delta chain (25 deep on
//! average in a packed history) only to learn the type at its end; a tenth of
//! a 100,000-commit log went there. The size itself is in the first entry: the
//! entry header of a whole object, or the second number of a delta's header.
//! So it is read there, from the repository's pack files through gitoxide's
//! pack reader. The type is checked once the blob is read.
//!
//! A blob not found in the pack files (loose, in an alternate) is left to
//! libgit2's header, as is any entry this reader cannot parse. So is every
//! blob of a pack whose index is not version 2 or whose large-offset
//! references point past their table: gix-pack follows those unchecked, and
//! a damaged index must cost the slower path, not a panic.

use git2::{Oid, Repository};

/// A delta's header holds two sizes of at most 10 bytes each.
const DELTA_HEADER: usize = 20;

/// At most this many compressed bytes are handed to zlib for a delta's header.
const DELTA_HEADER_INPUT: u64 = 4096;

/// The pack files of one repository, opened for size look-ups.
pub struct PackedSizes {
    packs: Vec<(gix_pack::index::File, gix_pack::data::File)>,
    inflate: gix_zlib::Inflate,
}

impl PackedSizes {
    /// Open the packs under `objects/pack` of `repo`; a pack that cannot be
    /// opened is left out (its blobs then go to libgit2's header).
    pub fn open(repo: &Repository) -> Self {
        let dir = repo.path().join("objects/pack");
        let mut packs = Vec::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "idx") {
                continue;
            }
            let kind = gix_hash::Kind::Sha1;
            let Ok(index) = gix_pack::index::File::at(&path, kind) else {
                continue;
            };
            if index.version() != gix_pack::index::Version::V2
                || !large_offsets_in_bounds(&path, u64::from(index.num_objects()))
            {
                continue;
            }
            if let Ok(data) = gix_pack::data::File::at(path.with_extension("pack"), kind) {
                packs.push((index, data));
            }
        }
        PackedSizes {
            packs,
            inflate: gix_zlib::Inflate::default(),
        }
    }

    /// The size of object `id` if it is in one of the packs and its entry parses.
    pub fn size(&mut self, id: Oid) -> Option<u64> {
        let key = gix_hash::oid::try_from_bytes(id.as_bytes()).ok()?;
        let (index, data, at) = self
            .packs
            .iter()
            .find_map(|(i, d)| i.lookup(key).map(|at| (i, d, at)))?;
        let entry = data.entry(index.pack_offset_at_index(at)).ok()?;
        if !entry.header.is_delta() {
            return Some(entry.decompressed_size);
        }
        let end = (entry.data_offset + DELTA_HEADER_INPUT).min(data.data_len() as u64);
        let input = data.entry_slice(entry.data_offset..end)?;
        let mut out = [0u8; DELTA_HEADER];
        self.inflate.reset();
        let (_, _, written) = self.inflate.once(input, &mut out).ok()?;
        let mut header = &out[..written];
        let _base = delta_size(&mut header)?;
        delta_size(&mut header)
    }
}

/// Whether every large-offset reference in version-2 pack index `path` of
/// `objects` entries points inside the index's large-offset table.
///
/// The layout (git's `gitformat-pack`): an 8-byte header, 256 fan-out
/// counts, then per object a 20-byte id and a CRC, then per object a 4-byte
/// offset, whose top bit set makes the rest a position in the table of
/// 8-byte offsets that follows; two 20-byte checksums end the file.
fn large_offsets_in_bounds(path: &std::path::Path, objects: u64) -> bool {
    use std::io::{Read as _, Seek as _};
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return false;
    };
    let small = 8 + 256 * 4 + objects * (20 + 4);
    let Some(large_bytes) = len.checked_sub(small + objects * 4 + 2 * 20) else {
        return false;
    };
    let large = large_bytes / 8;
    if file.seek(std::io::SeekFrom::Start(small)).is_err() {
        return false;
    }
    let mut offsets = std::io::BufReader::with_capacity(64 * 1024, file).take(objects * 4);
    let mut entry = [0u8; 4];
    for _ in 0..objects {
        if offsets.read_exact(&mut entry).is_err() {
            return false;
        }
        let offset = u32::from_be_bytes(entry);
        if offset & 0x8000_0000 != 0 && u64::from(offset & 0x7fff_ffff) >= large {
            return false;
        }
    }
    true
}

/// One size of a delta's header (7 bits a byte, least significant first);
/// `None` when it is cut short or does not fit 64 bits, so a size is never
/// read smaller than libgit2 will read it.
fn delta_size(bytes: &mut &[u8]) -> Option<u64> {
    let mut size = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        let bits = u64::from(b & 0x7f);
        if (bits << shift) >> shift != bits {
            return None;
        }
        size |= bits << shift;
        if b & 0x80 == 0 {
            return Some(size);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::delta_size;

    #[test]
    fn delta_sizes_read_as_git_writes_them() {
        let mut h: &[u8] = &[0x90, 0x4e, 0x05, 0xff];
        assert_eq!(delta_size(&mut h), Some(10_000));
        assert_eq!(delta_size(&mut h), Some(5));
        assert_eq!(delta_size(&mut h), None, "cut short");
        let mut huge: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(delta_size(&mut huge), Some(u64::MAX));
        let mut over: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert_eq!(delta_size(&mut over), None, "past 64 bits");
    }
}
