#include "task/digest.h"

#include <openssl/evp.h>

#include <stdexcept>

namespace simpler {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL SHA-256 initialisation failed");
  }
}
Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const void* data, size_t n) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n); }

Digest Sha256::finish() {
  Digest d{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.data(), &len);
  return d;
}

Digest sha256(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.finish();
}

std::string digest_hex(const Digest& d) {
  static const char* const kHex = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : d) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

}  // namespace simpler
