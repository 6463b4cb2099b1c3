//! `.eh_frame`, `.eh_frame_hdr` and `.debug_frame` (spec 5.3, 5.4).
//! Placeholder until implemented.
