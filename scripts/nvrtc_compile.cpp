// Compiles one generated source with NVRTC as Tessera's JIT does (src/jit/nvrtc_compiler.cpp's
// options, the kernel headers read from the repository instead of the embedded copies) and writes
// the CUBIN, or the PTX with --gpu-architecture=compute_XX. Used by scripts/nvrtc-vs-nvcc.sh.
// Usage: nvrtc_compile SOURCE NAME_EXPRESSION OUTPUT REPO_ROOT CUDA_INCLUDE [extra NVRTC options]
#include <nvrtc.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s SOURCE NAME_EXPRESSION OUTPUT REPO_ROOT CUDA_INCLUDE [options]\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str(), name = argv[2], cuda = argv[5];
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, source.c_str(), "generated.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) return 1;
  nvrtcAddNameExpression(prog, name.c_str());
  std::vector<std::string> options = {"-std=c++17", "-default-device", "-lineinfo", "--include-path=" + cuda + "/cccl",
                                      "--include-path=" + cuda, std::string("--include-path=") + argv[4]};
  bool arch_given = false;
  for (int i = 6; i < argc; ++i) {
    options.push_back(argv[i]);
    arch_given = arch_given || options.back().rfind("--gpu-architecture", 0) == 0;
  }
  if (!arch_given) options.push_back("--gpu-architecture=sm_90a");
  std::vector<const char*> ptrs;
  for (const std::string& o : options) ptrs.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(ptrs.size()), ptrs.data());
  size_t size = 0;
  nvrtcGetProgramLogSize(prog, &size);
  std::string log(size, '\0');
  nvrtcGetProgramLog(prog, &log[0]);
  if (r != NVRTC_SUCCESS) {
    std::fprintf(stderr, "%s\n", log.c_str());
    return 1;
  }
  std::string out;
  if (nvrtcGetCUBINSize(prog, &size) == NVRTC_SUCCESS && size > 0) {
    out.resize(size);
    nvrtcGetCUBIN(prog, &out[0]);
  } else {
    nvrtcGetPTXSize(prog, &size);
    out.resize(size);
    nvrtcGetPTX(prog, &out[0]);
    out.resize(out.size() > 0 ? out.size() - 1 : 0);  // the terminating NUL
  }
  std::ofstream(argv[3], std::ios::binary) << out;
  nvrtcDestroyProgram(&prog);
  return 0;
}
