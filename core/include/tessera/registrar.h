// What a plugin sees of the registry while it registers: a place to add factories.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessera/attention.h"
#include "tessera/backend.h"
#include "tessera/cache.h"
#include "tessera/communicator.h"
#include "tessera/component.h"
#include "tessera/constraint.h"
#include "tessera/decoder.h"
#include "tessera/error.h"
#include "tessera/params.h"
#include "tessera/quantizer.h"
#include "tessera/scheduler.h"

namespace tessera {

template <class T> struct KindOf;
template <> struct KindOf<Backend> { static constexpr ComponentKind value = ComponentKind::backend; };
template <> struct KindOf<Quantizer> { static constexpr ComponentKind value = ComponentKind::quantizer; };
template <> struct KindOf<Attention> { static constexpr ComponentKind value = ComponentKind::attention; };
template <> struct KindOf<Cache> { static constexpr ComponentKind value = ComponentKind::cache; };
template <> struct KindOf<Scheduler> { static constexpr ComponentKind value = ComponentKind::scheduler; };
template <> struct KindOf<Decoder> { static constexpr ComponentKind value = ComponentKind::decoder; };
template <> struct KindOf<Constraint> { static constexpr ComponentKind value = ComponentKind::constraint; };
template <> struct KindOf<Communicator> { static constexpr ComponentKind value = ComponentKind::comm; };

using ErasedFactory = std::function<std::shared_ptr<void>(const Params&)>;

class Registrar {
 public:
  virtual ~Registrar() = default;
  // Throws tessera::Error when (kind, name) is already registered, naming both libraries.
  virtual void add_erased(ComponentKind kind, std::string name, std::string doc,
                          std::vector<ParamSpec> params, ErasedFactory create) = 0;

  template <class T, class F>
  void add(std::string name, std::string doc, std::vector<ParamSpec> params, F factory) {
    add_erased(KindOf<T>::value, std::move(name), std::move(doc), std::move(params),
               [factory = std::move(factory)](const Params& p) -> std::shared_ptr<void> {
                 std::shared_ptr<T> object(factory(p));
                 return object;
               });
  }
};

}  // namespace tessera
