//! Lists the Vulkan adapters wgpu finds (`cargo run -p folio-gpu --example probe`).

fn main() {
    let list = folio_gpu::adapters();
    if list.is_empty() {
        println!("no Vulkan adapter");
    }
    for a in list {
        println!("{} | {} | software: {}", a.name, a.driver, a.software);
    }
}
