//! bincode 2 encoding of stored records, always decoded with a size limit.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest record (log entry, snapshot) the store decodes, in bytes.
pub const MAX_RECORD_BYTES: usize = 256 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_RECORD_BYTES>()
}

/// Encodes `value` with bincode's standard configuration.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, config())
}

/// How many bytes [`encode`] makes of `value`, without making them.
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, bincode::error::EncodeError> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config())?;
    Ok(size.bytes_written)
}

/// Decodes a whole `bytes` slice; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::error::DecodeError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(bincode::error::DecodeError::OtherString(format!(
            "{} trailing bytes",
            bytes.len() - used
        )));
    }
    Ok(value)
}
