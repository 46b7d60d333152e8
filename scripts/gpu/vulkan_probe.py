#!/usr/bin/env python3
"""Can this machine run Vulkan compute? Creates a Vulkan instance through a Vulkan loader
(libvulkan.so.1: the one in lib/ beside this file when present, else the system's) and
lists the physical devices, with ctypes only (no vulkaninfo, which needs X11/Wayland
libraries). scripts/gpu/probe.sh runs it on the lent GPU machine; docs/bench/gpu-machine.md
has what it found. Run with VK_LOADER_DEBUG=error,warn,info to see why a driver fails.
"""
import ctypes, os, sys
here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libvulkan.so.1")
lib = ctypes.CDLL(here if os.path.exists(here) else "libvulkan.so.1")
ver = ctypes.c_uint32()
print("vkEnumerateInstanceVersion rc", lib.vkEnumerateInstanceVersion(ctypes.byref(ver)),
      "version %d.%d.%d" % (ver.value >> 22, (ver.value >> 12) & 0x3ff, ver.value & 0xfff))
class AppInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]
class InstInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.POINTER(AppInfo)), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]
app = AppInfo(0, None, b"probe", 1, b"probe", 1, (1 << 22) | (3 << 12))
info = InstInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
inst = ctypes.c_void_p()
rc = lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(inst))
print("vkCreateInstance rc", rc)
if rc != 0:
    sys.exit(0)
n = ctypes.c_uint32()
lib.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None)
devs = (ctypes.c_void_p * n.value)()
lib.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), devs)
for d in devs:
    props = ctypes.create_string_buffer(1024)
    lib.vkGetPhysicalDeviceProperties(ctypes.c_void_p(d), props)
    api = int.from_bytes(props.raw[0:4], "little")
    name = props.raw[20:276].split(b"\0")[0].decode()
    print("device", name, "api %d.%d.%d" % (api >> 22, (api >> 12) & 0x3ff, api & 0xfff))
