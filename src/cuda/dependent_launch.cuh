// Programmatic dependent launch (sm_90): a kernel launched with programmatic_serialization() may
// start while the kernel before it on the stream is still running, once every block of that
// kernel has called allow_dependent_launch() (or exited). Its blocks then run their prologue
// (barrier set-up, register budgets) under the other kernel's last blocks and must call
// wait_for_prerequisite_grid() before reading anything that kernel wrote: the wait returns once
// it has completed and its memory is visible. Without the launch attribute both calls are no-ops,
// so a kernel that uses them stays correct on any stream and in captured graphs.
#pragma once

#include <cuda_runtime.h>

namespace vortex::cuda {

// Lets the next kernel on the stream (if launched with programmatic_serialization()) be scheduled
// once every block of this grid has called this. Calling it at a block's start is safe: the
// dependent's blocks then only fill SMs this grid's blocks leave, all of which are already placed.
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Waits until the grid this one depends on has completed and its writes are visible.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// The launch attribute that lets a kernel overlap the end of the previous one on its stream.
inline cudaLaunchAttribute programmatic_serialization() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

}  // namespace vortex::cuda
