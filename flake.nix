{
  description = "triton-collection: one kernel-builder output per Hub package";

  inputs = {
    kernel-builder.url = "github:huggingface/kernel-builder";
  };

  # Packages are listed in build.toml ([package.<hub-name>]); `triton-collection build`
  # renders each one, as kernel-builder expects it, into dist/hub/<hub-name>/.
  # Build one with:  triton-collection build && nix build "path:.#triton-norms"
  outputs = { self, kernel-builder }:
    let
      manifest = builtins.fromTOML (builtins.readFile ./build.toml);
      names = builtins.attrNames manifest.package;
      outputsFor = name: kernel-builder.lib.genKernelFlakeOutputs {
        inherit self;
        path = ./dist/hub + "/${name}";
      };
      perPackage = builtins.listToAttrs (map (name: { inherit name; value = outputsFor name; }) names);
      systems = builtins.attrNames (perPackage.${builtins.head names}.packages or { });
    in
    {
      kernels = perPackage;
      packages = builtins.listToAttrs (map
        (system: {
          name = system;
          value = builtins.listToAttrs (map
            (name: { inherit name; value = perPackage.${name}.packages.${system}.default; })
            names);
        })
        systems);
    };
}
