// stb_image built from the Debian header in the fuzz build only, so its PNG and JPEG decoders are instrumented.
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
