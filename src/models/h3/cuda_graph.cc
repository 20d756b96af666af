#include "models/h3/cuda_graph.h"

#include "cuda/runtime.h"

namespace vortex::h3 {

CapturedGraph::~CapturedGraph() { reset(); }

void CapturedGraph::reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  key_.clear();
}

Status CapturedGraph::capture(const std::string& key, cudaStream_t& stream, const std::function<Status()>& record) {
  reset();
  // The legacy default stream cannot be captured: record on a private stream that first waits for
  // everything already queued on the caller's.
  cudaStream_t capturing = nullptr;
  VORTEX_CUDA_CHECK(cudaStreamCreateWithFlags(&capturing, cudaStreamNonBlocking));
  const cudaStream_t caller = stream;
  cudaGraph_t graph = nullptr;
  const Status status = [&]() -> Status {
    VORTEX_CUDA_CHECK(cudaStreamSynchronize(caller));
    VORTEX_CUDA_CHECK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeThreadLocal));
    stream = capturing;
    const Status recorded = record();
    stream = caller;
    const cudaError_t ended = cudaStreamEndCapture(capturing, &graph);
    VORTEX_RETURN_IF_ERROR(recorded.with_context("while capturing a CUDA graph"));
    VORTEX_CUDA_CHECK(ended);
    VORTEX_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
    return ok_status();
  }();
  stream = caller;
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(capturing);
  if (!status.ok()) {
    reset();
    return status;
  }
  key_ = key;
  return ok_status();
}

Status CapturedGraph::launch(cudaStream_t stream) const {
  if (exec_ == nullptr) return internal_error("CapturedGraph::launch before a capture");
  VORTEX_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
  return ok_status();
}

}  // namespace vortex::h3
