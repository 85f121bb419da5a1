//! A gRPC message already encoded in protobuf's wire format, for calling any method by path.

use prost::Message;
use prost::bytes::{Buf, BufMut};

/// A request (or an answer whose content does not matter) as raw protobuf bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Raw(pub Vec<u8>);

impl Message for Raw {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}
