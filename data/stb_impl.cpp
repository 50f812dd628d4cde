// stb_image's PNG and JPEG decoders and stb_image_write, from Debian's headers, with headroom's assertion and
// allocation hooks (data/stb.h). Compiled without headroom's warnings: the code is stb's.
#include "data/stb.h"

#define STBI_ASSERT(x) ((x) ? (void)0 : ::hr::data::stb::assertion_failed(#x))
#define STBI_MALLOC(bytes) ::hr::data::stb::allocate(bytes)
#define STBI_REALLOC(p, bytes) ::hr::data::stb::reallocate(p, bytes)
#define STBI_FREE(p) ::hr::data::stb::release(p)
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
