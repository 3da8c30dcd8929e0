// Vulkan-Hpp as the system has it, plus VK_EXT_layer_settings where the headers predate it (Debian 12 ships
// 1.3.239; the extension arrived in 1.3.261). ggml-vulkan names its types when it creates its instance, to hand
// the validation layer a setting; with older headers the build fails there. Put this folder first on the
// include path (CMAKE_CXX_FLAGS=-I.../vulkan-compat): nothing here changes code built against newer headers.
#pragma once
#include_next <vulkan/vulkan.hpp>

#if VK_HEADER_VERSION < 261 && !defined(VK_EXT_layer_settings)
#include <vector>

namespace vk {
enum class LayerSettingTypeEXT : int32_t { eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4, eFloat32 = 5, eFloat64 = 6, eString = 7 };

struct LayerSettingEXT {  // VkLayerSettingEXT, field for field
    const char * pLayerName;
    const char * pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void * pValues;
};

struct LayerSettingsCreateInfoEXT {  // VkLayerSettingsCreateInfoEXT, field for field
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // VK_STRUCTURE_TYPE_LAYER_SETTINGS_CREATE_INFO_EXT
    const void * pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT * pSettings = nullptr;
    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT> & settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};
}  // namespace vk
#endif
