//! PNG copies of the report's SVG plots, for viewers that do not render SVG
//! (chat tools, some issue trackers, image previews).
//!
//! The SVG stays the source: resvg draws it, so both files show the same
//! chart. Text needs a real font, found among the system's fonts without
//! fontconfig's C library; a machine without any sans-serif font gets the
//! SVGs only, and the report says why.

use anyhow::{anyhow, Context, Result};
use resvg::{tiny_skia, usvg};
use std::sync::Arc;

/// Families tried, in order, for the plots' `sans-serif`; Debian's
/// `fonts-dejavu-core` provides the first.
const SANS_SERIF: [&str; 4] = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "Arial"];

/// Turns the report's SVG plots into PNGs with the fonts it found once.
pub struct Renderer {
    options: usvg::Options<'static>,
}

impl Renderer {
    /// Loads the system fonts; `Err` says why PNGs cannot be drawn here.
    pub fn new() -> Result<Self, String> {
        let mut fonts = usvg::fontdb::Database::new();
        fonts.load_system_fonts();
        let family = SANS_SERIF
            .into_iter()
            .find(|family| {
                fonts.faces().any(|face| face.families.iter().any(|(name, _)| name.eq_ignore_ascii_case(family)))
            })
            .ok_or_else(|| {
                format!(
                    "no sans-serif font among the system's {} font faces (tried {}); \
                     install fonts-dejavu-core for PNG plots",
                    fonts.len(),
                    SANS_SERIF.join(", ")
                )
            })?;
        fonts.set_sans_serif_family(family);
        let options =
            usvg::Options { font_family: family.to_string(), fontdb: Arc::new(fonts), ..usvg::Options::default() };
        Ok(Self { options })
    }

    /// The PNG of `svg`, at the SVG's own size in pixels.
    pub fn png(&self, svg: &str) -> Result<Vec<u8>> {
        let tree = usvg::Tree::from_str(svg, &self.options).context("parse the SVG")?;
        let size = tree.size().to_int_size();
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
            .ok_or_else(|| anyhow!("an empty {}x{} plot", size.width(), size.height()))?;
        resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
        pixmap.encode_png().context("encode the PNG")
    }
}
