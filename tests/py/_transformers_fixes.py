"""Two fixes LLaVA-NeXT's own code and today's transformers have that transformers 4.45.2 (the newest Debian's torch
1.13 allows) lacks, patched in as upstream wrote them so that an oracle is today's transformers: the AnyRes padding's
odd pixel goes below / to the right (PR #37819, 4.52; 4.45 left the padded image one pixel short), and unpad_image
rounds to 7 decimals before truncating (PR #34522, 4.47). Newer versions are left as they are.
"""
from transformers import LlavaNextImageProcessor, LlavaOnevisionImageProcessor


def upstream_fixes():
    import transformers
    from packaging.version import Version
    from transformers.models.llava_next import image_processing_llava_next as nip
    from transformers.models.llava_next import modeling_llava_next as nm
    from transformers.models.llava_onevision import image_processing_llava_onevision as oip
    from transformers.models.llava_onevision import modeling_llava_onevision as om
    version = Version(transformers.__version__)
    if version < Version("4.52"):
        for module, cls in ((nip, LlavaNextImageProcessor), (oip, LlavaOnevisionImageProcessor)):
            def _pad_for_patching(self, image, target_resolution, input_data_format, _size=module._get_patch_output_size):
                target_height, target_width = target_resolution
                new_height, new_width = _size(image, target_resolution, input_data_format)
                paste_x, r_x = divmod(target_width - new_width, 2)
                paste_y, r_y = divmod(target_height - new_height, 2)
                return self.pad(image, padding=((paste_y, paste_y + r_y), (paste_x, paste_x + r_x)))
            cls._pad_for_patching = _pad_for_patching
    if version < Version("4.47"):
        def unpad_image(tensor, original_size):
            if not isinstance(original_size, (list, tuple)):
                original_size = original_size.tolist()
            original_height, original_width = original_size
            current_height, current_width = tensor.shape[1:]
            if original_width / original_height > current_width / current_height:
                new_height = int(round(original_height * (current_width / original_width), 7))
                padding = (current_height - new_height) // 2
                return tensor[:, padding:current_height - padding, :]
            new_width = int(round(original_width * (current_height / original_height), 7))
            padding = (current_width - new_width) // 2
            return tensor[:, :, padding:current_width - padding]
        nm.unpad_image = om.unpad_image = unpad_image
